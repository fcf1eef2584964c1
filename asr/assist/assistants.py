"""Assistants for Whisper: every way a smaller or cheaper model can draft for the large one.

1. A decoder reading the model's own encoder output (distil-whisper's `WhisperForCausalLM`, or the model itself).
2. A full encoder-decoder with the same tokenizer: its encoder runs once per window.
3. A full encoder-decoder with another tokenizer (Universal Assisted Generation).
4. A lower-precision copy of the model's decoder (`self:bf16`, `self:int8`), reading the model's encoder output.
The model always verifies, so the words are the model's whichever is used.
"""

from __future__ import annotations

import copy
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import torch

from asr.errors import first_line
from asr.whisper.decoder import WhisperDecoderAdapter
from asr.whisper.logit_rules import whisper_filters
from asr.whisper.window import WindowContext, encode
from decoding import AssistantDraft, DraftSource
from decoding.universal import CrossTokenizerDraft

if TYPE_CHECKING:
    from asr.models.registry import WhisperBundle

# Precisions of a drafting copy of a decoder: `self:int8`, `tiny.en:bf16`, ...
PRECISIONS = ("bf16", "int8", "fp16", "fp32")
# An int8 drafting copy whose layers hold at most this many bytes of int8 weights (base's whole decoder, 25 MB;
# a draft model, a few) also keeps them in bfloat16 for its prompt pass and encoder-output products.
KEEP_DEQUANTIZED_BYTES = 32 * 2 ** 20


class SharedEncoderAssistant:
    """A decoder that reads the model's encoder output: pairings 1 (distil-style, or the model itself) and 4."""

    # (schedule, k) this assistant drafts with unless the options say otherwise; None: the options' default.
    schedule: tuple[str, int] | None = None
    # The speed-up over plain decoding its measured step costs expect (draft models; None: not measured).
    expected_speedup: float | None = None
    # Chosen by `--assistant auto`: a run that decodes beams or batches of windows decodes without it.
    chosen_by_auto: bool = False
    # False where `auto` chose it for files only: a live stream drafts from its last hypothesis alone.
    for_streams: bool = True

    def __init__(self, name: str, decoder_model: torch.nn.Module, dtype: torch.dtype | None = None) -> None:
        self.name = name
        self.decoder_model = decoder_model
        self.dtype = dtype

    def prepare(self, windows: list[WindowContext]) -> tuple[Callable[[list[int]], DraftSource], float]:
        encoder_output = torch.cat([w.encoder_output for w in windows])
        if self.dtype is not None and self.dtype != encoder_output.dtype:
            encoder_output = encoder_output.to(self.dtype)

        # Cross-attention keys and values once per window; temperature fallbacks take their rows.
        decoder = WhisperDecoderAdapter(self.decoder_model, encoder_output, drafting=True)

        def make_draft(rows: list[int]) -> DraftSource:
            return AssistantDraft(decoder.rows(rows), row_filters=[windows[r].filters for r in rows])

        return make_draft, 0.0


class FullAssistant:
    """A whole Whisper model as assistant; with another tokenizer its drafts go through text (pairings 2, 3)."""

    schedule: tuple[str, int] | None = None  # as SharedEncoderAssistant's
    expected_speedup: float | None = None
    chosen_by_auto: bool = False
    for_streams: bool = True

    def __init__(self, name: str, bundle: WhisperBundle, model_bundle: WhisperBundle) -> None:
        self.name = name
        self.bundle = bundle
        # What drafts: the assistant's own decoder, or a lower-precision copy of it (`NAME:int8`, make_assistant).
        self.decoder_model = bundle.model
        self.same_tokenizer = bundle.tokenizer.get_vocab() == model_bundle.tokenizer.get_vocab()
        self.model_tokenizer = model_bundle.tokenizer
        self.model_eot = model_bundle.special.eot

    def prepare(self, windows: list[WindowContext]) -> tuple[Callable[[list[int]], DraftSource], float]:
        start = time.perf_counter()
        features = torch.cat([w.features for w in windows])
        if self.bundle.n_mels != features.shape[1]:
            raise ValueError(f"assistant {self.name} expects {self.bundle.n_mels} mel bins, the model {features.shape[1]}")
        # Its own encoder runs once per window; every temperature fallback reuses the result.
        decoder = WhisperDecoderAdapter(self.decoder_model, encode(self.bundle.model, features), drafting=True)
        seconds = time.perf_counter() - start
        if self.same_tokenizer:
            def make_draft(rows: list[int]) -> DraftSource:
                return AssistantDraft(decoder.rows(rows), row_filters=[windows[r].filters for r in rows])
            return make_draft, seconds

        prompts, forced = zip(*(self._prompt(w) for w in windows))
        # A forced start (prefix) counts as generated for the rules, as in the model's filters.
        filters = [whisper_filters(self.bundle.special, len(prompt) - n, w.timestamps)
                   for prompt, n, w in zip(prompts, forced, windows)]

        def make_bridged_draft(rows: list[int]) -> DraftSource:
            return CrossTokenizerDraft(decoder.rows(rows), self.model_tokenizer, self.bundle.tokenizer,
                                       assistant_prompts=[prompts[r] for r in rows],
                                       row_filters=[filters[r] for r in rows])
        return make_bridged_draft, seconds

    def _prompt(self, window: WindowContext) -> tuple[list[int], int]:
        """The window's prompt in the assistant's tokens: the previous text re-tokenized (its last 223 tokens),
        and English where the assistant does not know the window's language; and how many of its last tokens
        are a forced start (<|0.00|> and the prefix re-tokenized)."""
        special = self.bundle.special
        previous: list[int] = []
        if window.previous:
            text = self.model_tokenizer.decode([t for t in window.previous if t < self.model_eot])
            previous = self.bundle.tokenizer.encode(text, add_special_tokens=False)[-223:]
        language = window.language if window.language in special.languages else "en"
        # A forced start (<|0.00|> and a prefix) is re-tokenized too; `prompt` puts <|0.00|> back first.
        text = [t for t in window.forced if t < self.model_eot]
        prefix = self.bundle.tokenizer.encode(self.model_tokenizer.decode(text), add_special_tokens=False) if text else []
        prompt = special.prompt(previous, language, window.task, window.timestamps, prefix)[0]
        return prompt, (len(prefix) + window.timestamps if prefix else 0)


def low_precision_decoder(model: torch.nn.Module, precision: str) -> tuple[torch.nn.Module, torch.dtype | None]:
    """A copy of the model's decoder and output head in lower precision; the model itself is left as it is.

    The copy looks tokens up in the model's own embedding table (rounding the rows it reads, which gives the
    values a rounded table would) rather than holding a second table (53 MB for base in bf16). Layers are
    copied one at a time, so an offloaded model (asr.models.offload) has one layer present at a time.

    Returns:
        (a module with `get_decoder()` and `get_output_embeddings()`, the dtype its inputs need, or None).
    """
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r} for self; choose one of {', '.join(PRECISIONS)}")
    device = next(model.parameters()).device
    if precision == "int8" and device.type != "cpu":
        raise ValueError("int8 drafting uses PyTorch's int8 CPU kernels; on a GPU use :bf16 or :fp16")
    from accelerate.hooks import remove_hook_from_module

    from asr.models.int8 import dequantize_linears, keep_dequantized_within, quantize_linears
    from asr.models.offload import materialized
    from asr.models.precision import int8_activations
    from decoding.kernels.int8 import Int8Linear
    from decoding.kernels.products import WidenedLinear

    # An int8 copy computes as the int8 model does: in float32 over decoding.kernels.native's int8 products, where a
    # step's small operations cost least, else in bfloat16 for PyTorch's int8 kernel.
    dtype = {"int8": int8_activations(), "bf16": torch.bfloat16, "fp16": torch.float16,
             "fp32": torch.float32}[precision]
    source = model.get_decoder()
    embedding = getattr(model, "shared_embedding", None)
    if embedding is None:
        embedding = source.embed_tokens.weight
    decoder = copy.deepcopy(source, memo={id(source.layers): torch.nn.ModuleList(), id(source.embed_tokens): None})
    decoder.to(dtype)
    for layer in source.layers:
        with materialized(layer):
            # An int8 model's layers (`--dtype int8`) are copied from their dequantised weights.
            layer_copy = dequantize_linears(remove_hook_from_module(copy.deepcopy(layer)))
        # The copy only ever runs through WhisperDecoderAdapter, so its q, k, v projections can be one matmul.
        fuse_layer_qkv(layer_copy)
        if precision == "int8":  # quantised from the fp32 weights; norms and biases in the copy's dtype
            quantize_linears(layer_copy.float(), dtype)
        decoder.layers.append(layer_copy.to(dtype))
    head = model.get_output_embeddings()
    if not isinstance(head, (torch.nn.Linear, WidenedLinear)):  # a draft model's own (a vocabulary subset): copied whole
        head_copy = copy.deepcopy(head)
        head_copy = quantize_linears(head_copy.float(), dtype).to(dtype) if precision == "int8" else head_copy.to(dtype)
    elif precision == "int8":
        head_copy = Int8Linear(head, dtype)
    else:
        head_copy = torch.nn.Linear(head.in_features, head.out_features, bias=head.bias is not None, device="meta")
        head_copy.weight = torch.nn.Parameter(head.weight.detach().to(dtype), requires_grad=False)
        if head.bias is not None:
            head_copy.bias = torch.nn.Parameter(head.bias.detach().to(dtype), requires_grad=False)
    keep_dequantized_within(decoder.layers, KEEP_DEQUANTIZED_BYTES)
    copied = DecoderCopy(decoder, head_copy, model.config)
    copied.shared_embedding = embedding.detach()
    return copied, dtype


class DecoderCopy(torch.nn.Module):
    """A Whisper decoder and its output head, without the encoder (and, for copies, without the token table:
    `shared_embedding` is then the model's, which `WhisperDecoderAdapter` reads)."""

    def __init__(self, decoder: torch.nn.Module, head: torch.nn.Module, config: Any) -> None:
        super().__init__()
        self.decoder = decoder
        self.proj_out = head
        self.config = config

    def get_decoder(self) -> torch.nn.Module:
        return self.decoder

    def get_output_embeddings(self) -> torch.nn.Module:
        return self.proj_out


def load_decoder_assistant(name: str, model_bundle: WhisperBundle, *, device: str, dtype: torch.dtype) -> SharedEncoderAssistant:
    """A distil-whisper style `WhisperForCausalLM` checkpoint (hub id or local folder) reading the model's encoder.

    Raises:
        ValueError: it cannot be loaded, or it cannot read the model's encoder output.
    """
    from transformers import WhisperForCausalLM

    try:
        decoder = WhisperForCausalLM.from_pretrained(name, dtype=dtype, use_safetensors=True, trust_remote_code=False)
    except (OSError, ValueError) as error:
        raise ValueError(f"cannot load assistant {name!r}: {first_line(error)}") from None
    check_pair(model_bundle, decoder.config, name)
    return SharedEncoderAssistant(name, decoder.to(device).eval())


def check_pair(model_bundle: WhisperBundle, assistant_config: Any, name: str) -> None:
    """Refuses a decoder that cannot read the model's encoder output or shares no vocabulary with it."""
    model_config = model_bundle.model.config
    if assistant_config.d_model != model_config.d_model:
        raise ValueError(f"assistant {name} has d_model {assistant_config.d_model}, the model's encoder gives "
                         f"{model_config.d_model}: it cannot share the encoder; pass a full Whisper model instead")
    if assistant_config.vocab_size != model_config.vocab_size:
        raise ValueError(f"assistant {name} has a vocabulary of {assistant_config.vocab_size}, the model "
                         f"{model_config.vocab_size}: a decoder-only assistant needs the model's tokenizer")


def same_encoder(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    """True when two Whisper models have identical encoder weights."""
    first, second = a.get_encoder().state_dict(), b.get_encoder().state_dict()
    return first.keys() == second.keys() and all(
        first[k].shape == second[k].shape and torch.equal(first[k].to(second[k].dtype), second[k]) for k in first)


def is_decoder_only(spec: str) -> bool:
    """True for a local checkpoint whose architecture is `WhisperForCausalLM` (distil-whisper style)."""
    config = Path(spec).expanduser() / "config.json"
    if not config.is_file():
        return False
    try:
        architectures = json.loads(config.read_text()).get("architectures") or []
    except (OSError, ValueError):
        return False
    return "WhisperForCausalLM" in architectures


def fuse_layer_qkv(layer: torch.nn.Module) -> torch.nn.Module:
    """Replaces a decoder layer's self-attention q, k and v projections by one Linear (in place; for drafting
    copies); returns `layer`. Whisper's key projection has no bias: its third of the fused bias is zero."""
    attention = layer.self_attn
    q, k, v = attention.q_proj, attention.k_proj, attention.v_proj
    fused = torch.nn.Linear(q.in_features, 3 * q.out_features, device=q.weight.device, dtype=q.weight.dtype)
    with torch.no_grad():
        fused.weight.copy_(torch.cat([q.weight, k.weight, v.weight]))
        fused.bias.copy_(torch.cat([q.bias, torch.zeros_like(q.bias), v.bias]))
    del attention.q_proj, attention.k_proj, attention.v_proj
    attention.qkv_proj = fused
    return layer
