"""Options of a transcription, grouped by purpose (after openai-whisper's DecodingOptions)."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from asr.constants import TASKS, TEMPERATURES
from audio.constants import CHUNK_LENGTH, FRAMES_PER_SECOND
from audio.vad import VadOptions
from decoding.schedule import make_schedule

if TYPE_CHECKING:
    from asr.models.registry import WhisperBundle

# Drafting when neither the options nor the assistant say otherwise: the seeds' heuristic, from 5 drafts.
DEFAULT_SCHEDULE = ("heuristic", 5)
# The VAD rules of the batched mode when none are given: short pauses end a region so that chunks can be cut
# there, and no region is longer than a window (faster-whisper's `BatchedInferencePipeline` defaults).
BATCHED_VAD = VadOptions(min_silence_duration_ms=160, max_speech_duration_s=float(CHUNK_LENGTH))
# Beams and samples per window at most (openai-whisper's command line uses 5): each is a row of the decoder's
# batch with its own key/value cache, so memory grows with them (1,000 beams reached 15.5 GB with base).
MAX_ROWS = 32
# Patience at most: beam search waits for round(beams x patience) finished sequences.
MAX_PATIENCE = 100.0


@dataclass(frozen=True)
class TranscribeOptions:
    """How to transcribe; defaults follow openai-whisper's `transcribe()`."""

    # What to produce: the spoken language (None: detect), the task, and timestamp tokens (segments at the
    # model's own times). Timestamps None: on for the sequential algorithm, off in the batched mode (one segment
    # per chunk, as faster-whisper's batched pipeline: faster; docs/long-form.md "Timestamps or not");
    # `uses_timestamps` says which.
    language: str | None = None
    task: str = "transcribe"
    timestamps: bool | None = None
    word_timestamps: bool = False
    # Text before the first window (names, spelling), and whether each window sees the previous window's text.
    initial_prompt: str | None = None
    condition_on_previous_text: bool = True
    # Temperature fallback: retry a window at the next temperature when a check below fails.
    temperatures: tuple[float, ...] = TEMPERATURES
    # Too repetitive (gzip ratio above this), too unsure (mean log-probability below this), or silence.
    compression_ratio_threshold: float | None = 2.4
    logprob_threshold: float | None = -1.0
    no_speech_threshold: float | None = 0.6
    # Skip a window whose peak level is below this (dBFS) without decoding: digital silence holds no speech,
    # yet Whisper tends to invent " you" there, and its no-speech guard lets it through. None: decode everything.
    silence_threshold_db: float | None = -60.0
    # Search (openai-whisper's names and meanings; its command line decodes with beam_size 5 and best_of 5, its
    # `transcribe()` and this library greedily by default). beam_size N > 1: beam search with N beams at
    # temperature 0, the model alone (no assistant); patience P: stop once round(N * P) sequences have ended
    # (default 1.0); length_penalty L in [0, 1]: rank candidates by sum log-probability / ((5 + length) / 6) ** L
    # (None: / length). best_of N: N samples per window at temperatures above 0 (each assisted when there is an
    # assistant), the best by the same ranking. None: greedy, one sample.
    beam_size: int | None = None
    patience: float | None = None
    length_penalty: float | None = None
    best_of: int | None = None
    # Most tokens decoded in one window (openai-whisper: half the decoder's context).
    max_new_tokens: int = 224
    # Drafting: schedule (heuristic, constant, confidence) and its starting k. None: the assistant's own
    # preference (`--assistant auto` for an offloaded model drafts many tokens a round), else heuristic from 5.
    schedule: str | None = None
    num_assistant_tokens: int | None = None
    # Seed for sampled (fallback) windows, for reproducible runs.
    seed: int | None = 0
    # Voice activity detection: None decodes all the audio; VadOptions() decodes Silero VAD's speech regions
    # only (laid end to end, times mapped back to the recording), or sets the chunking rules of the batched mode.
    vad: VadOptions | None = None
    # Batched long-form: None runs the sequential algorithm; N cuts the speech (VAD implied, BATCHED_VAD unless
    # `vad` is given) into chunks of at most 30 s at pauses and decodes N chunks at a time, each without the
    # previous chunk's text.
    batch_size: int | None = None
    # openai-whisper's and faster-whisper's further options (`check_options` below checks them; the command
    # line's text forms are parsed by `parse_suppress_tokens` and `parse_clip_timestamps`).
    # Token ids never generated; -1 stands for the model's own suppress list (openai-whisper's "-1").
    suppress_tokens: tuple[int, ...] = (-1,)
    # (start, end, start, end, ...) seconds: only these clips are decoded; an odd count runs to the end.
    clip_timestamps: tuple[float, ...] = ()
    # With word timestamps: skip silences longer than this (s) around segments that look hallucinated.
    hallucination_silence_threshold: float | None = None
    # The initial prompt comes before every window's previous text, not only the first window's.
    carry_initial_prompt: bool = False
    # Text the first window's output starts with (after the start sequence; faster-whisper's `prefix`).
    prefix: str | None = None
    # Text put in the prompt of windows without a prefix (faster-whisper's `hotwords`).
    hotwords: str | None = None
    # Language detection: over the first N windows (averaged), stopping at a window whose language is
    # above the threshold; `multilingual` detects every window's language (Segment.language).
    language_detection_segments: int = 1
    language_detection_threshold: float = 0.5
    multilingual: bool = False

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise ValueError(f"unknown task {self.task!r}; choose one of {', '.join(TASKS)}")
        if not self.temperatures or not all(math.isfinite(t) and t >= 0 for t in self.temperatures):
            raise ValueError(f"temperatures must be a non-empty list of numbers >= 0, got {self.temperatures}")
        for name in ("compression_ratio_threshold", "logprob_threshold", "no_speech_threshold", "silence_threshold_db"):
            value = getattr(self, name)
            if value is not None and math.isnan(value):
                raise ValueError(f"{name} must be a number, got nan")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        make_schedule(*self.drafting())
        if self.batch_size is not None and self.batch_size < 1:
            raise ValueError(f"batch size must be >= 1, got {self.batch_size}")
        self._check_search()

        check_options(self)

    def _check_search(self) -> None:
        # Each beam or sample is a row of the decoder's batch with its own cache: memory grows with them.
        if self.beam_size is not None and not 1 <= self.beam_size <= MAX_ROWS:
            raise ValueError(f"beam size must be between 1 and {MAX_ROWS}, got {self.beam_size}")
        if self.best_of is not None and not 1 <= self.best_of <= MAX_ROWS:
            raise ValueError(f"best of must be between 1 and {MAX_ROWS}, got {self.best_of}")
        if self.patience is not None:
            if not 0 < self.patience <= MAX_PATIENCE:
                raise ValueError(f"patience must be > 0 and at most {MAX_PATIENCE:g}, got {self.patience}")
            if not self.beam_search:
                raise ValueError("patience applies to beam search: give a beam size above 1 too")
            if round(self.beam_size * self.patience) < 1:
                raise ValueError(f"beam size {self.beam_size} with patience {self.patience} waits for no sequence")
        if self.length_penalty is not None and not 0 <= self.length_penalty <= 1:
            raise ValueError(f"length penalty must be between 0 and 1, got {self.length_penalty}")

    @property
    def uses_timestamps(self) -> bool:
        """Whether windows are decoded with timestamp tokens: as given, else on unless chunks are batched."""
        return self.batch_size is None if self.timestamps is None else self.timestamps

    @property
    def beam_search(self) -> bool:
        """Whether windows are beam searched at temperature 0 (beam_size > 1): the model alone, no assistant."""
        return self.beam_size is not None and self.beam_size > 1

    def drafting(self, preferred: tuple[str, int] | None = None) -> tuple[str, int]:
        """(schedule, k): what was asked for, else the assistant's `preferred` drafting, else DEFAULT_SCHEDULE."""
        schedule, k = preferred or DEFAULT_SCHEDULE
        return (schedule if self.schedule is None else self.schedule,
                k if self.num_assistant_tokens is None else self.num_assistant_tokens)

    @property
    def chunk_vad(self) -> VadOptions:
        """The VAD rules of the batched mode: the given ones with regions capped at a window, else BATCHED_VAD."""
        if self.vad is None:
            return BATCHED_VAD
        return replace(self.vad, max_speech_duration_s=min(self.vad.max_speech_duration_s, float(CHUNK_LENGTH)))


# openai-whisper's and faster-whisper's further options: their checks (one-line ValueErrors), their text forms
# (`"-1,50257"`, `"0,5.5,10,20"`), the suppress list against a model's vocabulary, clip timestamps in mel
# frames, and the prompt texts (initial prompt, prefix, hotwords) as tokens.
def split_numbers(text: str, kind: type, description: str) -> tuple:
    """"0,5.5,10" -> a tuple of `kind` (empty parts skipped).

    Raises:
        ValueError: "`description`, got `text`" for a part that is not one.
    """
    try:
        return tuple(kind(part) for part in text.split(",") if part.strip())
    except ValueError:  # also a number of more than 4,300 digits: shown cut, so the error stays one line
        shown = text if len(text) <= 80 else text[:60] + "..." + text[-10:]
        raise ValueError(f"{description}, got {shown!r}") from None


def parse_suppress_tokens(text: str) -> tuple[int, ...]:
    """"-1,50257" -> (-1, 50257); "" -> () (nothing suppressed beyond Whisper's special tokens)."""
    return split_numbers(text, int, "suppress tokens must be integer ids separated by commas")


def parse_clip_timestamps(text: str) -> tuple[float, ...]:
    """"0,5.5,10" -> (0.0, 5.5, 10.0): openai-whisper's "start,end,start,end,..." in seconds."""
    return split_numbers(text, float, "clip timestamps must be seconds separated by commas (start,end,...)")


def check_options(options: TranscribeOptions) -> None:
    """Checks the values of the further options.

    Raises:
        ValueError: a value out of range, text where numbers are expected, or options that do not go together.
    """
    for name, kind, parse in (("suppress_tokens", int, "parse_suppress_tokens"),
                              ("clip_timestamps", (int, float), "parse_clip_timestamps")):
        value = getattr(options, name)
        if isinstance(value, str) or not all(isinstance(v, kind) and not isinstance(v, bool) for v in value):
            raise ValueError(f"{name} must be a tuple of numbers, got {value!r} (text: asr.options.{parse})")
    if options.compression_ratio_threshold is not None and options.compression_ratio_threshold <= 0:
        raise ValueError(f"compression ratio threshold must be > 0, got {options.compression_ratio_threshold}")
    if options.no_speech_threshold is not None and not 0 <= options.no_speech_threshold <= 1:
        raise ValueError(f"no-speech threshold must be a probability in [0, 1], got {options.no_speech_threshold}")
    if any(t < -1 for t in options.suppress_tokens):
        raise ValueError(f"suppress tokens must be token ids (or -1 for the model's list), got {options.suppress_tokens}")
    clips = options.clip_timestamps
    if not all(math.isfinite(t) and t >= 0 for t in clips):
        raise ValueError(f"clip timestamps must be seconds >= 0, got {','.join(f'{t:g}' for t in clips)}")
    for start, end in zip(clips[::2], clips[1::2]):
        if end <= start:
            raise ValueError(f"clip timestamps: each clip must end after it starts, got {start:g},{end:g}")
    if clips and (options.vad is not None or options.batch_size is not None):
        raise ValueError("clip timestamps do not combine with VAD or batched chunks")
    if options.hallucination_silence_threshold is not None:
        if options.hallucination_silence_threshold <= 0:
            raise ValueError(f"hallucination silence threshold must be > 0 seconds, "
                             f"got {options.hallucination_silence_threshold}")
        if not options.word_timestamps:
            raise ValueError("the hallucination silence threshold needs word timestamps (--word-timestamps)")
    if options.carry_initial_prompt and not options.initial_prompt:
        raise ValueError("carrying the initial prompt needs an initial prompt (--initial-prompt)")
    if options.language_detection_segments < 1:
        raise ValueError(f"language detection segments must be >= 1, got {options.language_detection_segments}")
    if not 0 <= options.language_detection_threshold <= 1:
        raise ValueError(f"language detection threshold must be a probability in [0, 1], "
                         f"got {options.language_detection_threshold}")
    if options.multilingual and options.language is not None:
        raise ValueError("multilingual detects each window's language: do not give a language as well")


def seek_clips(clip_timestamps: tuple[float, ...], content_frames: int) -> list[tuple[int, int]]:
    """openai-whisper's clips in mel frames (an odd count ends at the audio's end); all the audio when none."""
    points = [round(t * FRAMES_PER_SECOND) for t in clip_timestamps] or [0]
    if len(points) % 2:
        points.append(content_frames)
    return [(min(start, content_frames), min(end, content_frames)) for start, end in zip(points[::2], points[1::2])]


def suppress_list(options: TranscribeOptions, bundle: WhisperBundle) -> tuple[int, ...] | None:
    """The ids to suppress at every step; None for the model's own list (the default, `-1` alone).

    As openai-whisper: -1 adds the model's list, and Whisper's task, start and no-speech tokens are always added.

    Raises:
        ValueError: an id outside the model's vocabulary.
    """
    ids = tuple(options.suppress_tokens)
    if ids == (-1,):
        return None
    vocabulary = len(bundle.tokenizer)
    unknown = [t for t in ids if t >= vocabulary]
    if unknown:
        raise ValueError(f"suppress tokens {unknown} are not in the model's vocabulary (ids 0 to {vocabulary - 1})")
    special = bundle.special
    chosen = {t for t in ids if t >= 0}
    if -1 in ids:
        chosen.update(special.suppress_tokens)
    chosen.update((special.transcribe, special.translate, special.sot, special.prev, special.no_speech))
    return tuple(sorted(chosen))


def check_for_model(options: TranscribeOptions, bundle: WhisperBundle) -> tuple[int, ...] | None:
    """Checks the options against the model; returns `suppress_list`.

    Raises:
        ValueError: an unknown suppress token, or multilingual detection with an English-only model.
    """
    if options.multilingual and not bundle.is_multilingual:
        raise ValueError(f"model {bundle.name} is English-only; it has no languages to detect (drop --multilingual)")
    return suppress_list(options, bundle)


@dataclass(frozen=True)
class PromptTexts:
    """The prompt texts of a run in the model's tokens."""

    initial: list[int]  # the initial prompt
    prefix: list[int]  # the first window's forced start (after the start sequence)
    hotwords: list[int]  # in the previous-text part of windows without a prefix


def prompt_room(bundle: WhisperBundle) -> int:
    """Most tokens of earlier text a decoder prompt holds: half the decoder's context less one (openai-whisper's
    limit for the previous text; faster-whisper's for the prefix and hotwords too)."""
    return bundle.model.config.max_target_positions // 2 - 1


def prompt_texts(options: TranscribeOptions, bundle: WhisperBundle) -> PromptTexts:
    """Tokenizes the initial prompt, the prefix and the hotwords as openai-whisper and faster-whisper do
    (a leading space, at most `prompt_room` tokens for the prefix and the hotwords)."""
    half = prompt_room(bundle)

    def encode(text: str | None) -> list[int]:
        return bundle.tokenizer.encode(" " + text.strip(), add_special_tokens=False) if text else []

    return PromptTexts(encode(options.initial_prompt), encode(options.prefix)[:half], encode(options.hotwords)[:half])
