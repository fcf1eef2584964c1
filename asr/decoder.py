"""Whisper's encoder and decoder as seen by the generic engine."""

from __future__ import annotations

import copy
from typing import Any

import torch

from decoding.adapters import additive_mask, crop_cache


class WhisperDecoderAdapter:
    """A Whisper decoder reading one window's encoder output, with an explicit self-attention cache.

    The cross-attention keys and values are computed on the first call and kept in the cache; cropping cuts
    only the self-attention part, so rejected drafts never cost a second pass over the encoder output.

    Works for `WhisperForConditionalGeneration` and for decoder-only `WhisperForCausalLM` assistants
    (distil-whisper style) alike: both expose a decoder and an output projection.
    """

    def __init__(self, model: torch.nn.Module, encoder_output: torch.Tensor) -> None:
        self.decoder = model.get_decoder()
        self.proj_out = model.get_output_embeddings()
        self.config = model.config
        self.encoder_output = encoder_output
        self.vocab_size = int(self.config.vocab_size)
        self.device = encoder_output.device
        self.dtype = encoder_output.dtype
        self.max_length = int(self.config.max_target_positions)
        # The cache needs the decoder's layer count; WhisperConfig's num_hidden_layers is the encoder's
        # (32 for distil-large-v3, whose decoder has 2).
        self.cache_config = copy.deepcopy(self.config)
        self.cache_config.num_hidden_layers = self.config.decoder_layers

    def new_cache(self, batch_size: int = 1) -> Any:
        from transformers import DynamicCache, EncoderDecoderCache

        return EncoderDecoderCache(DynamicCache(config=self.cache_config), DynamicCache(config=self.cache_config))

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, cache: Any, num_logits: int,
                attention_mask: torch.Tensor | None = None, position_ids: torch.Tensor | None = None) -> torch.Tensor:
        hidden = self.decoder(
            input_ids=input_ids, encoder_hidden_states=self.encoder_output, cache=cache, use_cache=True,
            attention_mask=additive_mask(attention_mask, self.dtype), position_ids=position_ids,
        ).last_hidden_state
        # The output head (vocab x d) dominates a decoder step on a CPU: apply it only where logits are needed.
        return self.proj_out(hidden[:, hidden.shape[1] - num_logits:]).float()

    def crop(self, cache: Any, length: int) -> None:
        crop_cache(cache, length)

    def select(self, cache: Any, rows: torch.Tensor) -> None:
        cache.batch_select_indices(rows)
        self.encoder_output = self.encoder_output[rows]


@torch.inference_mode()
def encode(model: torch.nn.Module, features: torch.Tensor) -> torch.Tensor:
    """Runs the encoder on `[batch, n_mels, 3000]` log-mel features; returns `[batch, 1500, d_model]`."""
    param = next(model.parameters())
    return model.get_encoder()(features.to(device=param.device, dtype=param.dtype)).last_hidden_state


@torch.inference_mode()
def detect_languages(model: torch.nn.Module, encoder_output: torch.Tensor, sot: int,
                     language_ids: dict[str, int]) -> list[tuple[str, dict[str, float]]]:
    """Whisper's language detection: the decoder's distribution over language tokens after <|startoftranscript|>.

    Args:
        encoder_output: `[B, 1500, d]` encoder outputs of the windows to classify.

    Returns:
        Per window: (the most likely language code, probability of every language code).
    """
    adapter = WhisperDecoderAdapter(model, encoder_output)
    batch = encoder_output.shape[0]
    ids = torch.full((batch, 1), sot, dtype=torch.long, device=adapter.device)
    logits = adapter.forward(ids, adapter.new_cache(batch), 1)[:, -1]
    codes = list(language_ids)
    index = torch.tensor([language_ids[c] for c in codes], device=logits.device)
    out = []
    for probs in logits[:, index].softmax(-1).tolist():
        ranked = dict(zip(codes, probs))
        out.append((max(ranked, key=ranked.get), ranked))
    return out
