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
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from asr.decoder import WhisperDecoderAdapter, encode, fuse_layer_qkv
from asr.logit_rules import whisper_filters
from asr.offload import offload_store
from asr.precision import Precision, compute_dtype
from decoding import AssistantDraft, DraftSource, LogitsFilter
from decoding.universal import CrossTokenizerDraft

logger = logging.getLogger(__name__)

# Precisions of a drafting copy of a decoder: `self:int8`, `tiny.en:bf16`, ...
PRECISIONS = ("bf16", "int8", "fp16", "fp32")


@dataclass
class WindowContext:
    """What an assistant needs to know about the window being decoded."""

    features: torch.Tensor  # [1, n_mels, 3000] log-mel features of the window
    encoder_output: torch.Tensor  # [1, 1500, d_model] the model's encoder output
    prompt: list[int]  # the model's decoder prompt
    filters: list[LogitsFilter]  # the model's logit rules for this prompt
    previous: list[int]  # previous-text tokens in the prompt (model ids)
    language: str
    task: str
    timestamps: bool


class SharedEncoderAssistant:
    """A decoder that reads the model's encoder output: pairings 1 (distil-style, or the model itself) and 4."""

    # (schedule, k) this assistant drafts with unless the options say otherwise; None: the options' default.
    schedule: tuple[str, int] | None = None

    def __init__(self, name: str, decoder_model: torch.nn.Module, dtype: torch.dtype | None = None) -> None:
        self.name = name
        self.decoder_model = decoder_model
        self.dtype = dtype

    def prepare(self, windows: list[WindowContext]) -> tuple[Callable[[list[int]], DraftSource], float]:
        encoder_output = torch.cat([w.encoder_output for w in windows])
        if self.dtype is not None and self.dtype != encoder_output.dtype:
            encoder_output = encoder_output.to(self.dtype)

        # Cross-attention keys and values once per window; temperature fallbacks take their rows.
        decoder = WhisperDecoderAdapter(self.decoder_model, encoder_output)

        def make_draft(rows: list[int]) -> DraftSource:
            return AssistantDraft(decoder.rows(rows), row_filters=[windows[r].filters for r in rows])

        return make_draft, 0.0


class FullAssistant:
    """A whole Whisper model as assistant; with another tokenizer its drafts go through text (pairings 2, 3)."""

    schedule: tuple[str, int] | None = None  # as SharedEncoderAssistant's

    def __init__(self, name: str, bundle: Any, model_bundle: Any) -> None:
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
        decoder = WhisperDecoderAdapter(self.decoder_model, encode(self.bundle.model, features))
        seconds = time.perf_counter() - start
        if self.same_tokenizer:
            def make_draft(rows: list[int]) -> DraftSource:
                return AssistantDraft(decoder.rows(rows), row_filters=[windows[r].filters for r in rows])
            return make_draft, seconds

        special = self.bundle.special
        prompts = [self._prompt(w) for w in windows]
        filters = [whisper_filters(
            suppress_tokens=special.suppress_tokens, begin_suppress_tokens=special.begin_suppress_tokens,
            sample_begin=len(prompt), timestamps=w.timestamps, eot=special.eot,
            no_timestamps=special.no_timestamps, timestamp_begin=special.timestamp_begin,
        ) for prompt, w in zip(prompts, windows)]

        def make_bridged_draft(rows: list[int]) -> DraftSource:
            return CrossTokenizerDraft(decoder.rows(rows), self.model_tokenizer, self.bundle.tokenizer,
                                       assistant_prompts=[prompts[r] for r in rows],
                                       row_filters=[filters[r] for r in rows])
        return make_bridged_draft, seconds

    def _prompt(self, window: WindowContext) -> list[int]:
        """The assistant's own start sequence: English-only models take no language or task tokens."""
        special = self.bundle.special
        prompt: list[int] = []
        if window.previous:
            text = self.model_tokenizer.decode([t for t in window.previous if t < self.model_eot])
            prompt = [special.prev] + self.bundle.tokenizer.encode(text, add_special_tokens=False)[-223:]
        prompt.append(special.sot)
        if self.bundle.is_multilingual:
            prompt += [special.languages.get(window.language, special.languages.get("en")),
                       special.translate if window.task == "translate" else special.transcribe]
        if not window.timestamps:
            prompt.append(special.no_timestamps)
        return prompt


def low_precision_decoder(model: torch.nn.Module, precision: str) -> tuple[torch.nn.Module, torch.dtype | None]:
    """A copy of the model's decoder and output head in lower precision; the model itself is left as it is.

    The copy looks tokens up in the model's own embedding table (rounding the rows it reads, which gives the
    values a rounded table would) rather than holding a second table (53 MB for base in bf16). Layers are
    copied one at a time, so an offloaded model (asr.offload) has one layer present at a time.

    Returns:
        (a module with `get_decoder()` and `get_output_embeddings()`, the dtype its inputs need, or None).
    """
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r} for self; choose one of {', '.join(PRECISIONS)}")
    device = next(model.parameters()).device
    if precision == "int8" and device.type != "cpu":
        raise ValueError("int8 drafting uses PyTorch's int8 CPU kernels; on a GPU use :bf16 or :fp16")
    from accelerate.hooks import remove_hook_from_module

    from asr.int8 import Int8Linear, dequantize_linears, quantize_linears
    from asr.offload import materialized

    dtype = {"int8": torch.bfloat16, "bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[precision]
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
        if precision == "int8":  # quantised from the fp32 weights; norms and biases in bf16
            quantize_linears(layer_copy.float())
        decoder.layers.append(layer_copy.to(dtype))
    head = model.get_output_embeddings()
    if not isinstance(head, torch.nn.Linear):  # a draft's own head (a vocabulary subset): copied whole, as it is small
        head_copy = copy.deepcopy(head)
        head_copy = quantize_linears(head_copy.float()).to(dtype) if precision == "int8" else head_copy.to(dtype)
    elif precision == "int8":
        head_copy = Int8Linear(head)
    else:
        head_copy = torch.nn.Linear(head.in_features, head.out_features, bias=head.bias is not None, device="meta")
        head_copy.weight = torch.nn.Parameter(head.weight.detach().to(dtype), requires_grad=False)
        if head.bias is not None:
            head_copy.bias = torch.nn.Parameter(head.bias.detach().to(dtype), requires_grad=False)
    copied = _DecoderCopy(decoder, head_copy, model.config)
    copied.shared_embedding = embedding.detach()
    return copied, dtype


class _DecoderCopy(torch.nn.Module):
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


def load_decoder_assistant(name: str, model_bundle: Any, *, device: str, dtype: torch.dtype) -> SharedEncoderAssistant:
    """A distil-whisper style `WhisperForCausalLM` checkpoint (hub id or local folder) reading the model's encoder.

    Raises:
        ValueError: it cannot be loaded, or it cannot read the model's encoder output.
    """
    from transformers import WhisperForCausalLM

    try:
        decoder = WhisperForCausalLM.from_pretrained(name, dtype=dtype, use_safetensors=True, trust_remote_code=False)
    except (OSError, ValueError) as error:
        raise ValueError(f"cannot load assistant {name!r}: {str(error).splitlines()[0]}") from None
    check_pair(model_bundle, decoder.config, name)
    return SharedEncoderAssistant(name, decoder.to(device).eval())


def check_pair(model_bundle: Any, assistant_config: Any, name: str) -> None:
    """Refuses a decoder that cannot read the model's encoder output or shares no vocabulary with it."""
    model_config = model_bundle.model.config
    if assistant_config.d_model != model_config.d_model:
        raise ValueError(f"assistant {name} has d_model {assistant_config.d_model}, the model's encoder gives "
                         f"{model_config.d_model}: it cannot share the encoder; pass a full Whisper model instead")
    if assistant_config.vocab_size != model_config.vocab_size:
        raise ValueError(f"assistant {name} has a vocabulary of {assistant_config.vocab_size}, the model "
                         f"{model_config.vocab_size}: a decoder-only assistant needs the model's tokenizer")


def make_assistant(spec: str, model_bundle: Any, *, device: str = "cpu", dtype: Precision = torch.float32):
    """Resolves `--assistant`: none, auto, self[:PRECISION], or a registry name, hub id or local folder with an
    optional `:PRECISION` (`tiny.en:int8`: the assistant drafts with a lower-precision copy of its decoder).

    Returns:
        An assistant with `prepare`, or None for plain decoding.

    Raises:
        ValueError: an unknown assistant or precision, or one that cannot be paired with the model.
    """
    from asr.registry import load_model

    spec = spec.strip()
    if spec == "auto" and offload_store(model_bundle.model) is not None:
        return _auto_for_offloaded(model_bundle, device=device, dtype=dtype)
    if spec == "auto":
        device_type = next(model_bundle.model.parameters()).device.type
        chosen = auto_assistant(device_type, model_bundle.source)
        logger.info("--assistant auto chose %s", chosen)
        try:
            assistant = make_assistant(chosen, model_bundle, device=device, dtype=dtype)
        except ValueError as error:
            # auto must never fail a run: without its student (no Hub access, say) it decodes plainly.
            logger.warning("--assistant auto: %s; decoding without an assistant", error)
            return None
        if isinstance(assistant, FullAssistant) and device_type == "cpu":
            # The CPU choice counts on sharing the encoder: a second large encoder costs seconds per window.
            logger.warning("--assistant auto: %s does not share the model's encoder; decoding without an "
                           "assistant", chosen)
            return None
        return assistant
    if spec in ("none", ""):
        return None
    name, precision = _split_precision(spec)
    if name == "self":
        module, input_dtype = low_precision_decoder(model_bundle.model, precision or "fp32")
        return SharedEncoderAssistant(spec, module.eval(), input_dtype)
    folder = draft_folder(name)
    if folder is not None:
        from asr.distill.student import load_draft

        draft = load_draft(folder, model_bundle.model)
        return _in_precision(SharedEncoderAssistant(spec, draft), precision, spec)
    if _is_decoder_only(name):
        assistant = load_decoder_assistant(name, model_bundle, device=device, dtype=compute_dtype(dtype))
        return _in_precision(assistant, precision, spec)
    bundle = load_model(name, device=device, dtype=dtype)
    assistant = FullAssistant(spec, bundle, model_bundle)
    if assistant.same_tokenizer and _same_encoder(bundle.model, model_bundle.model):
        # distil-whisper copies the teacher's encoder: run it once, for both, and keep only the student's
        # decoder and head (the encoder copy is 2.5 GB for large-v3 in fp32).
        logger.info("assistant %s has the model's encoder: sharing it", spec)
        student = _DecoderCopy(bundle.model.get_decoder(), bundle.model.get_output_embeddings(), bundle.model.config)
        return _in_precision(SharedEncoderAssistant(spec, student.eval()), precision, spec)
    if precision is not None:
        assistant.decoder_model = low_precision_decoder(bundle.model, precision)[0].eval()
    return assistant


# Drafts trained by `asr distill` and shipped with the package, by name (`--assistant base-draft`).
DRAFTS_DIR = Path(__file__).resolve().parent / "drafts"


def shipped_drafts() -> dict[str, Path]:
    """Names of the drafts shipped with the package, and their folders."""
    from asr.distill.student import is_draft_folder

    if not DRAFTS_DIR.is_dir():
        return {}
    return {p.name: p for p in sorted(DRAFTS_DIR.iterdir()) if is_draft_folder(p)}


def draft_folder(name: str) -> Path | None:
    """The folder of a draft named `name` (shipped) or at path `name` (written by `asr distill`), else None."""
    from asr.distill.student import is_draft_folder

    shipped = shipped_drafts().get(name)
    if shipped is not None:
        return shipped
    return Path(name).expanduser() if is_draft_folder(name) else None


def _split_precision(spec: str) -> tuple[str, str | None]:
    """`tiny.en:int8` -> (`tiny.en`, `int8`); `self:X` -> (`self`, `X`), checked by `low_precision_decoder`;
    any other spec without a known precision suffix is all name."""
    name, _, suffix = spec.rpartition(":")
    if name == "self" or (name and suffix in PRECISIONS):
        return name, suffix
    return spec, None


def _in_precision(assistant: SharedEncoderAssistant, precision: str | None, spec: str) -> SharedEncoderAssistant:
    """The same shared-encoder assistant drafting with a lower-precision copy of its decoder, if asked."""
    if precision is None:
        return assistant
    module, input_dtype = low_precision_decoder(assistant.decoder_model, precision)
    return SharedEncoderAssistant(spec, module.eval(), input_dtype)


# distil-whisper students that share their teacher's encoder and tokenizer (hub ids by teacher).
DISTIL_FOR = {
    "openai/whisper-large-v3": "distil-whisper/distil-large-v3",
    "openai/whisper-large-v2": "distil-whisper/distil-large-v2",
    "openai/whisper-medium.en": "distil-whisper/distil-medium.en",
    "openai/whisper-small.en": "distil-whisper/distil-small.en",
}


# Students worth drafting with on a CPU as well. fp32, 2 threads, real shapes with random weights
# (`scripts/bench_gpu.py shapes --device cpu ...`, README): a distil-large-v3 step costs 0.087 of a large-v3
# step (22 ms against 254), distil-medium.en 0.11 of medium.en's (18 against 166), so drafting pays from ~30 %
# and ~20 % agreement on. distil-small.en keeps 4 of small.en's 12 layers and the whole output head: 0.38 of
# its step (21 against 56), paying only above ~46 % agreement and by 1.1-1.2x at 70-80 %, so none there.
CPU_STUDENTS = ("distil-whisper/distil-large-v3", "distil-whisper/distil-large-v2", "distil-whisper/distil-medium.en")


def auto_assistant(device_type: str, source: str) -> str:
    """What `--assistant auto` picks for a model loaded from `source` ("hub:openai/whisper-large-v3", ...) on
    a `device_type` device: the assistant our measurements show to be fastest, with the same words.

    A distil-whisper student that shares the model's encoder where one exists: on a GPU, where a large
    model's 32-layer step costs ~14x a 2-layer student's (H200, fp16); on a CPU only where our measurements
    show the student's step to be a small fraction of the model's (`CPU_STUDENTS`). Otherwise none: for a
    model as small as `base` no assistant available here pays on either (a CPU step is bound by memory traffic
    that a same-size copy cannot shed; the distilled `base-draft` agrees too rarely to make up for its own
    steps; a GPU step is bound by kernel launches: README, "What `auto` picks").
    """
    student = DISTIL_FOR.get(source.removeprefix("hub:"), "none")
    if device_type == "cpu" and student not in CPU_STUDENTS:
        return "none"
    return student


# Drafting for an offloaded model. A pass reads every offloaded layer whether it checks 1 token or 16, so it
# costs about the same for both (`scripts/bench_offload.py`), while a resident draft step stays cheap: many
# tokens per pass pay, and a constant k wastes no round growing from 5 as the heuristic does.
OFFLOAD_SCHEDULE = ("constant", 10)


def offload_assistants(source: str, device_type: str) -> list[str]:
    """Resident assistants worth trying for a model whose decoder layers are offloaded, best first.

    A distil-whisper student that shares the model's encoder where one exists; then, on a CPU, the int8 copy of
    the model's own decoder (weight-only int8, ~91-93 % agreement with base's greedy tokens, 52 MB for base).
    A draft trained for the model (`asr distill`; `base-draft`) drafts for an offloaded model by name too;
    it belongs before the int8 copy here once measured offloaded (its steps are cheaper, its agreement lower).
    On a GPU a same-size fp16 copy would need the memory the offload frees, so there is no such fallback there.
    """
    candidates = []
    student = DISTIL_FOR.get(source.removeprefix("hub:"))
    if student is not None:
        candidates.append(student)
    if device_type == "cpu":
        candidates.append("self:int8")
    return candidates


def _auto_for_offloaded(model_bundle: Any, *, device: str, dtype: torch.dtype) -> SharedEncoderAssistant | None:
    """`--assistant auto` for an offloaded model: the first resident assistant of `offload_assistants` that
    loads and shares the model's encoder, drafting OFFLOAD_SCHEDULE; None when there is none."""
    device_type = next(model_bundle.model.parameters()).device.type
    for name in offload_assistants(model_bundle.source, device_type):
        try:
            assistant = make_assistant(name, model_bundle, device=device, dtype=dtype)
        except ValueError as error:
            logger.warning("--assistant auto (offloaded model): %s; trying the next assistant", error)
            continue
        if isinstance(assistant, SharedEncoderAssistant):
            assistant.schedule = OFFLOAD_SCHEDULE
            logger.info("--assistant auto chose %s for the offloaded model, drafting %s k=%d", name, *OFFLOAD_SCHEDULE)
            return assistant
        logger.warning("--assistant auto (offloaded model): %s does not share the model's encoder", name)
    logger.warning("--assistant auto: no resident assistant for the offloaded model; decoding without one")
    return None


def _same_encoder(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    """True when two Whisper models have identical encoder weights."""
    first, second = a.get_encoder().state_dict(), b.get_encoder().state_dict()
    return first.keys() == second.keys() and all(
        first[k].shape == second[k].shape and torch.equal(first[k].to(second[k].dtype), second[k]) for k in first)


def _is_decoder_only(spec: str) -> bool:
    """True for a local checkpoint whose architecture is `WhisperForCausalLM` (distil-whisper style)."""
    config = Path(spec).expanduser() / "config.json"
    if not config.is_file():
        return False
    try:
        architectures = json.loads(config.read_text()).get("architectures") or []
    except (OSError, ValueError):
        return False
    return "WhisperForCausalLM" in architectures
