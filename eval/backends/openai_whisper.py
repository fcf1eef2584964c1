"""openai-whisper, the referee of Whisper's transcription rules, on this library's weights.

openai-whisper's `transcribe()` is the definition of how Whisper transcribes (its features, its decoding rules,
its long-form loop). `openai_whisper_model` converts a loaded model (the bundled CTranslate2 `base` included)
into openai-whisper's state-dict layout, so that it runs the very same weights; `OpenAIWhisperBackend` is the
`openai-whisper` configuration of `asr eval`, and `scripts/referee.py` compares it with ours token by token.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from eval.configs import EvalConfig
from eval.backends.decoded import BackendUnavailable, Decoded

if TYPE_CHECKING:
    from asr.models.registry import WhisperBundle

INSTALL_HINT = 'pip install -e ".[baselines]" (or pip install openai-whisper)'


def _names(encoder_layers: int, decoder_layers: int) -> list[tuple[str, str]]:
    """(transformers module, openai-whisper module) of every layer with a weight (and mostly a bias)."""
    names = [("model.encoder.conv1", "encoder.conv1"), ("model.encoder.conv2", "encoder.conv2"),
             ("model.encoder.layer_norm", "encoder.ln_post"), ("model.decoder.layer_norm", "decoder.ln"),
             ("model.decoder.embed_tokens", "decoder.token_embedding")]
    projections = (("q_proj", "query"), ("k_proj", "key"), ("v_proj", "value"), ("out_proj", "out"))
    for part, n in (("encoder", encoder_layers), ("decoder", decoder_layers)):
        for i in range(n):
            src, dst = f"model.{part}.layers.{i}.", f"{part}.blocks.{i}."
            names += [(src + "self_attn_layer_norm", dst + "attn_ln"), (src + "fc1", dst + "mlp.0"),
                      (src + "fc2", dst + "mlp.2"), (src + "final_layer_norm", dst + "mlp_ln")]
            names += [(f"{src}self_attn.{a}", f"{dst}attn.{b}") for a, b in projections]
            if part == "decoder":
                names.append((src + "encoder_attn_layer_norm", dst + "cross_attn_ln"))
                names += [(f"{src}encoder_attn.{a}", f"{dst}cross_attn.{b}") for a, b in projections]
    return names


def openai_whisper_checkpoint(bundle: WhisperBundle) -> dict[str, Any]:
    """The model's weights as an openai-whisper checkpoint (`{"dims": ..., "model_state_dict": ...}`, float32),
    the form `whisper.load_model(PATH)` reads once saved with `torch.save`."""
    config = bundle.model.config
    state = {name: tensor.detach().to("cpu", torch.float32) for name, tensor in bundle.model.state_dict().items()}
    converted = {}
    for src, dst in _names(config.encoder_layers, config.decoder_layers):
        converted[dst + ".weight"] = state[src + ".weight"]
        if src + ".bias" in state:  # the key projections have none, in both layouts
            converted[dst + ".bias"] = state[src + ".bias"]
    converted["encoder.positional_embedding"] = state["model.encoder.embed_positions.weight"]
    converted["decoder.positional_embedding"] = state["model.decoder.embed_positions.weight"]
    dims = dict(n_mels=config.num_mel_bins, n_vocab=config.vocab_size,
                n_audio_ctx=config.max_source_positions, n_audio_state=config.d_model,
                n_audio_head=config.encoder_attention_heads, n_audio_layer=config.encoder_layers,
                n_text_ctx=config.max_target_positions, n_text_state=config.d_model,
                n_text_head=config.decoder_attention_heads, n_text_layer=config.decoder_layers)
    return {"dims": dims, "model_state_dict": converted}


def openai_whisper_model(bundle: WhisperBundle) -> Any:
    """openai-whisper's `Whisper` on the bundle's weights, in float32 on the CPU, with the model's alignment heads.

    Raises:
        BackendUnavailable: openai-whisper is not installed, or cannot build this architecture.
    """
    try:
        from whisper.model import ModelDimensions, Whisper
    except ImportError:
        raise BackendUnavailable(f"the openai-whisper package is not installed ({INSTALL_HINT})") from None
    config = bundle.model.config
    if config.encoder_ffn_dim != 4 * config.d_model or config.decoder_ffn_dim != 4 * config.d_model:
        raise BackendUnavailable(f"openai-whisper builds feed-forward layers 4 x d_model wide; {bundle.name}'s are "
                                 f"{config.encoder_ffn_dim} and {config.decoder_ffn_dim} for d_model {config.d_model}")
    checkpoint = openai_whisper_checkpoint(bundle)
    model = Whisper(ModelDimensions(**checkpoint["dims"]))
    model.load_state_dict(checkpoint["model_state_dict"])
    if bundle.alignment_heads:
        dims = model.dims
        heads = torch.zeros(dims.n_text_layer, dims.n_text_head, dtype=torch.bool)
        for layer, head in bundle.alignment_heads:
            heads[layer, head] = True
        model.register_buffer("alignment_heads", heads.to_sparse(), persistent=False)
    return model.eval()


class OpenAIWhisperBackend:
    """openai-whisper's `transcribe()` on the same weights: greedy (`beam=N`: its beam search), its temperature
    fallback (`temperature=T`: that one only), in float32, in this process (it is PyTorch too)."""

    def __init__(self, config: EvalConfig, bundle: WhisperBundle, device: str) -> None:
        self.config = config
        self.model = openai_whisper_model(bundle).to(device)

    def decode(self, samples: np.ndarray, language: str | None) -> Decoded:
        import whisper

        options: dict[str, Any] = {}
        if self.config.temperature is not None:
            options["temperature"] = self.config.temperature
        if self.config.beam_size:
            options.update(beam_size=self.config.beam_size, best_of=self.config.beam_size)
        result = whisper.transcribe(self.model, samples, language=language, fp16=False, verbose=None, **options)
        tokens = sum(len(segment["tokens"]) for segment in result["segments"])
        return Decoded(text=result["text"], language=result["language"], generated_tokens=tokens)
