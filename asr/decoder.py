"""Whisper's encoder and decoder as seen by the generic engine."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F


@dataclass
class DecoderCache:
    """Self-attention keys and values `[layers, B, heads, capacity, head_dim]`, filled up to `length` slots."""

    keys: torch.Tensor
    values: torch.Tensor
    length: int = 0

    def ensure(self, needed: int) -> None:
        """Grows the buffers (doubling) so that `needed` slots fit."""
        capacity = self.keys.shape[3]
        if needed <= capacity:
            return
        extra = max(needed, 2 * capacity) - capacity
        pad = (0, 0, 0, extra)
        self.keys = F.pad(self.keys, pad)
        self.values = F.pad(self.values, pad)


class WhisperDecoderAdapter:
    """A Whisper decoder reading a batch of windows' encoder outputs, with preallocated key/value buffers.

    A transformers decoder step spends on a CPU about as long in Python and cache bookkeeping as in arithmetic
    (base: ~19 ms a token in fp32). This pass calls the decoder's own Linear / LayerNorm modules in
    transformers' order, so its fp32 logits are bit for bit transformers' (tests/test_transcribe.py), but keeps
    keys and values in buffers written by position (gpt-fast's KVCache) and computes the cross-attention keys
    and values once per window: ~20 % less per step for the model, more for low-precision drafts.

    Works for `WhisperForConditionalGeneration`, decoder-only `WhisperForCausalLM` assistants (distil-whisper
    style) and the low-precision decoder copies (bf16, int8 linears) alike: all expose a decoder and a head.
    """

    def __init__(self, model: torch.nn.Module, encoder_output: torch.Tensor, capacity: int = 256) -> None:
        decoder = model.get_decoder()
        self.layers = list(decoder.layers)
        self.embed_tokens = decoder.embed_tokens
        self.embed_positions = decoder.embed_positions.weight
        self.layer_norm = decoder.layer_norm
        self.proj_out = model.get_output_embeddings()
        config = model.config
        self.heads = config.decoder_attention_heads
        self.head_dim = config.d_model // self.heads
        self.vocab_size = int(config.vocab_size)
        self.max_length = int(config.max_target_positions)
        self.device = encoder_output.device
        self.dtype = self.embed_positions.dtype
        self.capacity = capacity
        self.cross = [self._cross_kv(layer, encoder_output.to(self.dtype)) for layer in self.layers]

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        """`[B, T, d]` -> `[B, heads, T, head_dim]`."""
        return x.view(x.shape[0], x.shape[1], self.heads, self.head_dim).transpose(1, 2)

    @torch.inference_mode()
    def _cross_kv(self, layer: Any, encoder_output: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Cross-attention keys and values, once per window."""
        attention = layer.encoder_attn
        return self._split(attention.k_proj(encoder_output)), self._split(attention.v_proj(encoder_output))

    def new_cache(self, batch_size: int = 1) -> DecoderCache:
        shape = (len(self.layers), batch_size, self.heads, self.capacity, self.head_dim)
        return DecoderCache(torch.zeros(shape, dtype=self.dtype, device=self.device),
                         torch.zeros(shape, dtype=self.dtype, device=self.device))

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, cache: DecoderCache, num_logits: int,
                attention_mask: torch.Tensor | None = None, position_ids: torch.Tensor | None = None) -> torch.Tensor:
        batch, width = input_ids.shape
        start = cache.length
        cache.ensure(start + width)
        if position_ids is None:
            position_ids = torch.arange(start, start + width, device=self.device).expand(batch, width)
        if attention_mask is None and width > 1:
            slots = torch.arange(start + width, device=self.device)
            attention_mask = (slots[None, :] <= (start + torch.arange(width, device=self.device))[:, None])[None, None]
        x = self.embed_tokens(input_ids) + self.embed_positions[position_ids]
        end = start + width
        for index, layer in enumerate(self.layers):
            attention = layer.self_attn
            h = layer.self_attn_layer_norm(x)
            cache.keys[index, :, :, start:end] = self._split(attention.k_proj(h))
            cache.values[index, :, :, start:end] = self._split(attention.v_proj(h))
            a = F.scaled_dot_product_attention(self._split(attention.q_proj(h)), cache.keys[index, :, :, :end],
                                               cache.values[index, :, :, :end], attn_mask=attention_mask)
            x = x + attention.out_proj(a.transpose(1, 2).reshape(batch, width, -1))
            h = layer.encoder_attn_layer_norm(x)
            keys, values = self.cross[index]
            a = F.scaled_dot_product_attention(self._split(layer.encoder_attn.q_proj(h)), keys, values)
            x = x + layer.encoder_attn.out_proj(a.transpose(1, 2).reshape(batch, width, -1))
            x = x + layer.fc2(layer.activation_fn(layer.fc1(layer.final_layer_norm(x))))
        cache.length = end
        x = self.layer_norm(x[:, width - num_logits:])
        return self.proj_out(x).float()

    def crop(self, cache: DecoderCache, length: int) -> None:
        cache.length = min(cache.length, length)

    def select(self, cache: DecoderCache, rows: torch.Tensor) -> None:
        cache.keys = cache.keys[:, rows]
        cache.values = cache.values[:, rows]
        self.cross = [(k[rows], v[rows]) for k, v in self.cross]



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
