"""Decoding configurations to compare, parsed from `--compare` strings.

    greedy[,vad]                            the model alone (this library's decoder)
    assisted[:NAME][,OPTION=VALUE...][,vad] this library's assisted decoding; NAME as `asr transcribe --assistant`
                                            (default auto)
    batched:N[,assistant=NAME]              this library's batched long-form (`asr transcribe --batch-size N`)
    beam:N[,best_of=M][,patience=P]         this library's beam search, N beams at temperature 0 and M samples
                                            (default N, as openai-whisper's command line pairs them) above
    transformers                            transformers' own `generate()`, no assistant
    transformers-assisted:NAME[,k=..]       transformers' `generate(assistant_model=...)`: the baseline to beat
    faster-whisper[,compute_type=..][,batched=N][,beam=N]  CTranslate2, when installed: the outside speed anchor
                                            (beam=N: its beam search with N beams; default 1, greedy)
    openai-whisper[,beam=N][,temperature=T] openai-whisper's own `transcribe()` on the same weights, when
                                            installed: the referee of Whisper's rules (docs/parity.md)

Options: `dtype=float32|bfloat16|float16|int8` (this library's kinds: the model in that precision, as
`asr transcribe --dtype`; default: the run's `--dtype`), `kernels=aten|onednn|full-head` (this library's kinds: PyTorch's
default kernels instead of this library's, `reference_kernels()`; oneDNN for every product, none of
`decoding.kernels.native`'s, `onednn_only()`; or every greedy logit of a float32 head in float32, no bfloat16 screen,
`full_head()`: the switches of `decoding.kernels.products`), `schedule=heuristic|constant|confidence`,
`k=N` (drafts per round, at the start), `best_of=M` and `patience=P` (beam only), `temperature=T`
(a single temperature, no fallback), `compute_type=default|int8|float32|...` (faster-whisper only), `vad` (Silero
VAD: the speech only, `asr transcribe --vad`), `assistant=NAME` (batched only), `timestamps=on|off` (batched:
timestamp tokens; default off, one segment per chunk), `batched=N` (faster-whisper's `BatchedInferencePipeline`, batch N).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

KINDS = ("greedy", "assisted", "batched", "beam", "transformers", "transformers-assisted", "faster-whisper",
         "openai-whisper")
# Kinds that need an assistant NAME after the colon.
ASSISTED_KINDS = frozenset({"assisted", "transformers-assisted"})
# Options each kind accepts.
OPTIONS = {
    "greedy": ("temperature", "vad", "dtype", "kernels"),
    "assisted": ("schedule", "k", "temperature", "vad", "dtype", "kernels"),
    "batched": ("assistant", "schedule", "k", "temperature", "timestamps", "dtype", "kernels"),
    "beam": ("best_of", "patience", "temperature", "vad", "dtype", "kernels"),
    "transformers": (),
    "transformers-assisted": ("schedule", "k"),
    "faster-whisper": ("compute_type", "batched", "beam"),
    "openai-whisper": ("beam", "temperature"),
}
# Values of the kernels option.
KERNELS = ("aten", "onednn", "full-head")
# Options written as a bare word (on), not OPTION=VALUE.
FLAGS = frozenset({"vad"})
# transformers knows only these two schedules.
TRANSFORMERS_SCHEDULES = ("heuristic", "constant")


@dataclass(frozen=True)
class EvalConfig:
    """One configuration of a comparison."""

    # The `--compare` string as given: the configuration's name in every table.
    name: str
    # One of KINDS.
    kind: str
    # The assistant (for the assisted kinds): `self:int8`, `tiny.en`, a hub id or a folder.
    assistant: str | None = None
    # Drafting schedule and its starting k (None: the library's default).
    schedule: str | None = None
    num_assistant_tokens: int | None = None
    # One temperature, no fallback (None: the default fallback chain).
    temperature: float | None = None
    # CTranslate2 compute type for faster-whisper (None: float32 on a CPU, the weights' own type on a GPU).
    compute_type: str | None = None
    # Silero VAD before the sequential algorithm; chunks decoded this many at a time (batched kinds; None: not).
    vad: bool = False
    batch_size: int | None = None
    # Timestamp tokens in the batched mode.
    timestamps: bool | None = None  # None: the mode's default (off when batched)
    # The model's precision for this configuration (an `asr --dtype` name; None: the run's).
    dtype: str | None = None
    # `aten`: PyTorch's default kernels (`reference_kernels` in `decoding.kernels.products`) instead of this library's;
    # `onednn`: oneDNN's products only, no `decoding.kernels.native` (`onednn_only`); `full-head`: no bfloat16 screen
    # of a float32 head (`full_head`); None: this library's defaults.
    kernels: str | None = None
    # Beam search (beam kind; beam_size also faster-whisper's and openai-whisper's): beams at temperature 0, samples per fallback
    # temperature, patience.
    beam_size: int | None = None
    best_of: int | None = None
    patience: float | None = None

    @property
    def uses_assistant(self) -> bool:
        return self.kind in ASSISTED_KINDS or (self.kind == "batched" and self.assistant is not None)


def parse_config(text: str) -> EvalConfig:
    """Parses one `--compare` value.

    Raises:
        ValueError: an unknown kind or option, a missing assistant name, or a bad value.
    """
    name = text.strip()
    head, *option_parts = [part.strip() for part in name.split(",")]
    kind, colon, assistant = head.partition(":")
    kind = kind.strip()
    if kind not in KINDS:
        raise ValueError(f"unknown configuration {name!r}; start it with one of {', '.join(KINDS)}")
    batch_size = beam_size = None
    if kind == "assisted" and not assistant.strip():
        assistant = "auto"  # as `asr transcribe`'s default
    elif kind in ASSISTED_KINDS:
        if not assistant.strip():
            raise ValueError(f"configuration {name!r} needs an assistant: {kind}:NAME (e.g. {kind}:tiny.en)")
    elif kind == "batched":
        batch_size = _positive_int(assistant.strip() or "missing", "the batch size (batched:N)", name)
        assistant = ""
    elif kind == "beam":
        beam_size = _positive_int(assistant.strip() or "missing", "the beam size (beam:N)", name)
        assistant = ""
    elif colon:
        raise ValueError(f"configuration {name!r}: {kind} takes no assistant; use assisted:{assistant}")
    options: dict[str, str] = {}
    for part in option_parts:
        key, equals, value = part.partition("=")
        key, value = key.strip(), value.strip()
        if not equals and key in FLAGS:
            value = "on"
        elif not equals or not key or not value:
            raise ValueError(f"configuration {name!r}: expected OPTION=VALUE, got {part!r}")
        if key not in OPTIONS[kind]:
            accepted = ", ".join(OPTIONS[kind]) or "none"
            raise ValueError(f"configuration {name!r}: unknown option {key!r} for {kind} (accepted: {accepted})")
        if key in options:
            raise ValueError(f"configuration {name!r}: option {key!r} given twice")
        options[key] = value
    if kind in ("faster-whisper", "openai-whisper"):
        batch_size = _positive_int(options.get("batched"), "batched", name)
        beam_size = _positive_int(options.get("beam"), "beam", name)
    from asr.constants import DTYPES

    if options.get("dtype", "float32") not in DTYPES[1:]:
        raise ValueError(f"configuration {name!r}: unknown dtype {options['dtype']!r}; choose one of "
                         f"{', '.join(DTYPES[1:])}")
    if options.get("kernels", "aten") not in KERNELS:
        raise ValueError(f"configuration {name!r}: kernels takes aten (PyTorch's defaults), onednn (no native "
                         f"kernels) or full-head (no bfloat16 screen of the head), got {options['kernels']!r}")
    for key in ("timestamps", "vad"):
        if options.get(key, "on") not in ("on", "off"):
            raise ValueError(f"configuration {name!r}: {key} must be on or off, got {options[key]!r}")
    return EvalConfig(
        name=name, kind=kind, assistant=assistant.strip() or options.get("assistant"),
        vad=options.get("vad") == "on", batch_size=batch_size,
        timestamps={"on": True, "off": False}.get(options.get("timestamps")),
        schedule=_schedule(options.get("schedule"), kind, name),
        num_assistant_tokens=_positive_int(options.get("k"), "k", name),
        temperature=_temperature(options.get("temperature"), name),
        compute_type=options.get("compute_type"), dtype=options.get("dtype"),
        kernels=options.get("kernels"), beam_size=beam_size,
        best_of=_positive_int(options.get("best_of", str(beam_size)), "best_of", name) if kind == "beam" else None,
        patience=_patience(options.get("patience"), name),
    )


def parse_configs(texts: Sequence[str]) -> list[EvalConfig]:
    """Parses every `--compare` value; the first is the reference for speed-ups and exactness.

    Raises:
        ValueError: a bad configuration, or the same one twice.
    """
    configs = [parse_config(text) for text in texts]
    names = [c.name for c in configs]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ValueError(f"configuration {repeated[0]!r} given twice")
    if not configs:
        raise ValueError("no configuration to compare; pass --compare greedy (and more)")
    return configs


def _schedule(value: str | None, kind: str, name: str) -> str | None:
    if value is None:
        return None
    from decoding.schedule import SCHEDULES

    accepted = TRANSFORMERS_SCHEDULES if kind == "transformers-assisted" else SCHEDULES
    if value not in accepted:
        raise ValueError(f"configuration {name!r}: unknown schedule {value!r}; choose one of {', '.join(accepted)}")
    return value


def _positive_int(value: str | None, key: str, name: str) -> int | None:
    if value is None:
        return None
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise ValueError(f"configuration {name!r}: {key} must be a whole number >= 1, got {value!r}")
    return number


def _patience(value: str | None, name: str) -> float | None:
    if value is None:
        return None
    try:
        number = float(value)
    except ValueError:
        number = 0.0
    if not number > 0:  # also refuses NaN
        raise ValueError(f"configuration {name!r}: patience must be a number > 0, got {value!r}")
    return number


def _temperature(value: str | None, name: str) -> float | None:
    if value is None:
        return None
    try:
        number = float(value)
    except ValueError:
        number = -1.0
    if not number >= 0:  # also refuses NaN
        raise ValueError(f"configuration {name!r}: temperature must be a number >= 0, got {value!r}")
    return number
