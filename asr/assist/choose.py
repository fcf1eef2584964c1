"""Which assistant drafts for a model: `--assistant` resolved (none, auto, self:PRECISION, a shipped draft model, a
model name, hub id or folder), and the rules `auto` follows.

A draft model (`base-draft`, any `asr distill` folder) drafts constant rounds whose length is chosen when it is
paired with its model, from the two models' step costs measured then (`asr.assist.rounds.measured_rounds`: the
model's pass over 1 to 6 tokens and the draft's step, timed once per pair and logged at INFO, and the round with
the most expected tokens a second at the draft's held-out agreement); an offloaded model's draft drafts
`OFFLOAD_SCHEDULE` untimed. `--schedule` and `--num-assistant-tokens` override either.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from asr.assist.assistants import (
    PRECISIONS,
    DecoderCopy,
    FullAssistant,
    SharedEncoderAssistant,
    is_decoder_only,
    load_decoder_assistant,
    low_precision_decoder,
    same_encoder,
)
from asr.assist.rounds import DRAFT_ACCEPTANCE, measured_rounds
from asr.errors import first_line
from asr.models.offload import OffloadOptions, offload_store
from asr.models.precision import Precision, compute_dtype, is_int8_model

if TYPE_CHECKING:
    from asr.models.registry import WhisperBundle

logger = logging.getLogger(__name__)

# `auto` drafts with a draft model only where the cost model (`asr.assist.rounds`) expects at least this speed-up
# of the decoder: real decoding came out some 0.2 below the expectation (what a round costs beyond its two passes,
# and long-form acceptance below the held-out agreement the model assumes). AMD EPYC: expected ~1.4x, measured
# 1.24x on the short recordings and 1.03x on the long files; Intel Xeon, once checks of several drafts were
# cheaper (2026-12-05): expected 1.11-1.16x, measured 0.91x on the long files, the whole run 0.96x; on 2026-12-06
# expected 1.30x (rounds of one), measured 0.90-1.00x on the long files: the bar is above that.
AUTO_MIN_SPEEDUP = 1.35


def load_pair(model: str, assistant: str = "auto", *, device: str = "cpu", dtype: Precision = torch.float32,
              offload: OffloadOptions | None = None, batched: bool = False) -> tuple[WhisperBundle, Any]:
    """Loads the model (offloading its decoder layers if asked: `asr.models.offload`) and resolves `assistant`
    for it (`make_assistant`; `auto`, the default, drafts where it pays, and "none" decodes plainly).

    Raises:
        ValueError: an unknown model or assistant, a pair that cannot work together, or offload options that
            cannot be honoured.
    """
    from asr.models.registry import load_model

    bundle = load_model(model, device=device, dtype=dtype, offload=offload)
    return bundle, make_assistant(assistant, bundle, device=device, dtype=dtype, batched=batched)


def make_assistant(spec: str, model_bundle: WhisperBundle, *, device: str = "cpu", dtype: Precision = torch.float32,
                   batched: bool = False):
    """Resolves `--assistant`: none, auto, self[:PRECISION], or a registry name, hub id or local folder with an
    optional `:PRECISION` (`tiny.en:int8`: the assistant drafts with a lower-precision copy of its decoder).

    `batched`: windows will be decoded several at a time (`--batch-size`); `auto` then takes no shipped draft model,
    which made batches slower (docs/drafts.md).

    Returns:
        An assistant with `prepare`, or None for plain decoding.

    Raises:
        ValueError: an unknown assistant or precision, or one that cannot be paired with the model.
    """
    from asr.models.registry import load_model

    spec = spec.strip()
    if spec == "auto" and offload_store(model_bundle.model) is not None:
        return _auto_for_offloaded(model_bundle, device=device, dtype=dtype)
    if spec == "auto":
        return _auto(model_bundle, device=device, dtype=dtype, batched=batched)
    if spec in ("none", ""):
        return None
    name, precision = _split_precision(spec)
    if name == "self":
        module, input_dtype = low_precision_decoder(model_bundle.model, precision or "fp32")
        return SharedEncoderAssistant(spec, module.eval(), input_dtype)
    folder = draft_folder(name)
    if folder is not None:
        from asr.assist.draft_model import load_draft

        draft = load_draft(folder, model_bundle.model)
        assistant = _in_precision(SharedEncoderAssistant(spec, draft), precision, spec)
        if offload_store(model_bundle.model) is not None:
            assistant.schedule = OFFLOAD_SCHEDULE
        else:
            assistant.schedule, assistant.expected_speedup = measured_rounds(
                model_bundle, assistant.decoder_model, assistant.dtype, draft_acceptance(folder))
        return assistant
    if is_decoder_only(name):
        assistant = load_decoder_assistant(name, model_bundle, device=device, dtype=compute_dtype(dtype))
        return _in_precision(assistant, precision, spec)
    bundle = load_model(name, device=device, dtype=dtype)
    assistant = FullAssistant(spec, bundle, model_bundle)
    if assistant.same_tokenizer and same_encoder(bundle.model, model_bundle.model):
        # distil-whisper copies the teacher's encoder: run it once, for both, and keep only the student's
        # decoder and head (the encoder copy is 2.5 GB for large-v3 in fp32).
        logger.info("assistant %s has the model's encoder: sharing it", spec)
        student = DecoderCopy(bundle.model.get_decoder(), bundle.model.get_output_embeddings(), bundle.model.config)
        return _in_precision(SharedEncoderAssistant(spec, student.eval()), precision, spec)
    if precision is not None:
        assistant.decoder_model = low_precision_decoder(bundle.model, precision)[0].eval()
    return assistant


def _auto(model_bundle: WhisperBundle, *, device: str, dtype: Precision, batched: bool):
    """`--assistant auto`: the assistant `auto_assistant` names (a distil-whisper student), else on a CPU the int8
    copy of a shipped draft model for the model where its measured costs expect it to pay (`AUTO_MIN_SPEEDUP`),
    else none. It never fails a run: an assistant that cannot be had is one warning and plain decoding.

    Returns:
        The assistant, marked `chosen_by_auto` (a run that decodes beams or batches drops it), or None.
    """
    device_type = next(model_bundle.model.parameters()).device.type
    chosen = auto_assistant(device_type, model_bundle.source)
    shipped = False
    # Not for an int8 model: its steps are cheap enough that the draft made it slower (0.94-0.99x in the matrix
    # of docs/drafts.md), where the costs measured at load sometimes expected a gain.
    if chosen == "none" and device_type == "cpu" and not batched and not is_int8_model(model_bundle.model):
        chosen = shipped_draft_for(model_bundle.model) or chosen
        shipped = chosen != "none"
    if chosen == "none":
        logger.info("--assistant auto chose none")
        return None
    try:
        assistant = make_assistant(chosen, model_bundle, device=device, dtype=dtype)
    except Exception as error:  # auto never fails a run: whatever stops its choice, it decodes plainly
        # Without its student (no Hub access, say), with a damaged draft, or a failure measuring the pair.
        logger.warning("--assistant auto: %s; decoding without an assistant", first_line(error))
        return None
    if isinstance(assistant, FullAssistant) and device_type == "cpu":
        # The CPU choice counts on sharing the encoder: a second large encoder costs seconds per window.
        logger.warning("--assistant auto: %s does not share the model's encoder; decoding without an "
                       "assistant", chosen)
        return None
    expected = getattr(assistant, "expected_speedup", None)
    if expected is not None and expected < AUTO_MIN_SPEEDUP:
        logger.info("--assistant auto: %s expects %.2fx plain decoding's speed here (measured step costs); "
                    "decoding without an assistant", chosen, expected)
        return None
    logger.info("--assistant auto chose %s", chosen)
    assistant.chosen_by_auto = True
    # In a live stream such a draft drafts only the new audio at the buffer's end (~9 tokens an update, half of
    # them kept) and pays each update a pass over the prompt and the hypothesis's kept tokens and its projections
    # of the window: measured on a CPU it costs more than it saves (docs/live.md), so streams leave it out.
    assistant.for_streams = not shipped
    return assistant


def draft_acceptance(folder: Path) -> float:
    """The share of the model's tokens the draft in `folder` predicted on its held-out recordings (teacher-forced:
    what its drafts' acceptance is in greedy decoding), or `DRAFT_ACCEPTANCE` when its report has none."""
    from asr.assist.draft_model import read_description

    agreement = read_description(folder).get("training", {}).get("agreement")
    return float(agreement) if isinstance(agreement, (int, float)) and 0.0 < agreement < 1.0 else DRAFT_ACCEPTANCE


# Drafts trained by `asr distill` and shipped with the package, by name (`--assistant base-draft`).
DRAFTS_DIR = Path(__file__).resolve().parent / "drafts"


def shipped_drafts() -> dict[str, Path]:
    """Names of the drafts shipped with the package, and their folders."""
    from asr.assist.draft_model import is_draft_folder

    if not DRAFTS_DIR.is_dir():
        return {}
    return {p.name: p for p in sorted(DRAFTS_DIR.iterdir()) if is_draft_folder(p)}


def shipped_draft_for(model: torch.nn.Module) -> str | None:
    """The int8 copy of a shipped draft model trained for `model` (`base-draft:int8` for `base`), or None; a
    shipped draft that cannot be read (damaged, a future format) is one warning and None.

    `auto` drafts with it on a CPU where no distil-whisper student exists, in constant rounds of the length
    measured best for the pair (`asr.assist.rounds`), where those costs expect it to pay (docs/drafts.md has
    how it compares with plain decoding in every mode).
    """
    from asr.assist.draft_model import DraftMismatch, check_draft

    for name, folder in shipped_drafts().items():
        try:
            check_draft(folder, model)
        except DraftMismatch:
            continue  # trained for another model
        except ValueError as error:
            logger.warning("--assistant auto: %s; decoding without it", first_line(error))
            continue
        return f"{name}:int8"
    return None


def draft_folder(name: str) -> Path | None:
    """The folder of a draft model named `name` (shipped) or at path `name` (written by `asr distill`), else None."""
    from asr.assist.draft_model import is_draft_folder

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


# Students worth drafting with on a CPU as well: those whose step is a small fraction of their teacher's, so
# that drafting pays even at modest agreement (`scripts/bench_gpu.py shapes --device cpu`; docs/benchmarks.md,
# "Larger models: step costs"). distil-small.en keeps 4 of small.en's 12 layers and the whole output head:
# too large a share of small.en's step to pay at the agreement it reaches.
CPU_STUDENTS = ("distil-whisper/distil-large-v3", "distil-whisper/distil-large-v2", "distil-whisper/distil-medium.en")


def auto_assistant(device_type: str, source: str) -> str:
    """What `--assistant auto` picks for a model loaded from `source` ("hub:openai/whisper-large-v3", ...) on
    a `device_type` device: the assistant our measurements show to be fastest, with the same words.

    A distil-whisper student that shares the model's encoder where one exists: on a GPU, where a large
    model's step costs many times a 2-layer student's; on a CPU only where the student's step is a small
    fraction of the model's (`CPU_STUDENTS`). Otherwise none here; on a CPU `make_assistant` then drafts with
    a shipped draft model trained for the model if there is one (`shipped_draft_for`: `base-draft:int8` for `base`).
    On a GPU nothing pays for a model as small as `base` (a step is bound by kernel launches:
    docs/benchmarks.md, "`base` on a GPU").
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
    the model's own decoder (weight-only int8: it agrees with the model on most tokens, at a quarter of the fp32
    size). A shipped draft model (`base-draft:int8`) is not tried: offloaded, in rounds of 10, it was 1.20x and
    1.07x plain decoding on short and long recordings where the int8 copy was 1.45x and 1.98x (docs/drafts.md):
    a pass costs the same for 1 or 10 tokens, so what pays is agreement, not a cheap step. On a GPU a same-size fp16 copy would need the
    memory the offload frees, so there is no such fallback there.
    """
    candidates = []
    student = DISTIL_FOR.get(source.removeprefix("hub:"))
    if student is not None:
        candidates.append(student)
    if device_type == "cpu":
        candidates.append("self:int8")
    return candidates


def _auto_for_offloaded(model_bundle: WhisperBundle, *, device: str, dtype: torch.dtype) -> SharedEncoderAssistant | None:
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
