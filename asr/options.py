"""Options of a transcription, grouped by purpose (after openai-whisper's DecodingOptions)."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from audio.vad import VadOptions
from decoding.schedule import make_schedule

TASKS = ("transcribe", "translate")
# Drafting when neither the options nor the assistant say otherwise: the seeds' heuristic, from 5 drafts.
DEFAULT_SCHEDULE = ("heuristic", 5)
# The VAD rules of the batched mode when none are given: short pauses end a region so that chunks can be cut
# there, and no region is longer than a window (faster-whisper's `BatchedInferencePipeline` defaults).
BATCHED_VAD = VadOptions(min_silence_duration_ms=160, max_speech_duration_s=30.0)


@dataclass(frozen=True)
class TranscribeOptions:
    """How to transcribe; defaults follow openai-whisper's `transcribe()`."""

    # What to produce: the spoken language (None: detect), the task, and timestamped segments.
    language: str | None = None
    task: str = "transcribe"
    timestamps: bool = True
    word_timestamps: bool = False
    # Text before the first window (names, spelling), and whether each window sees the previous window's text.
    initial_prompt: str | None = None
    condition_on_previous_text: bool = True
    # Temperature fallback: retry a window at the next temperature when a check below fails.
    temperatures: tuple[float, ...] = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)
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
    # openai-whisper's and faster-whisper's further options (asr.more_options checks them).
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
        if self.word_timestamps and not self.timestamps:
            raise ValueError("word timestamps need timestamps; drop --without-timestamps")
        make_schedule(*self.drafting())
        if self.batch_size is not None and self.batch_size < 1:
            raise ValueError(f"batch size must be >= 1, got {self.batch_size}")
        self._check_search()
        from asr.more_options import check_options

        check_options(self)

    def _check_search(self) -> None:
        if self.beam_size is not None and self.beam_size < 1:
            raise ValueError(f"beam size must be >= 1, got {self.beam_size}")
        if self.best_of is not None and self.best_of < 1:
            raise ValueError(f"best of must be >= 1, got {self.best_of}")
        if self.patience is not None:
            if not self.patience > 0:
                raise ValueError(f"patience must be > 0, got {self.patience}")
            if not self.beam_search:
                raise ValueError("patience applies to beam search: give a beam size above 1 too")
            if round(self.beam_size * self.patience) < 1:
                raise ValueError(f"beam size {self.beam_size} with patience {self.patience} waits for no sequence")
        if self.length_penalty is not None and not 0 <= self.length_penalty <= 1:
            raise ValueError(f"length penalty must be between 0 and 1, got {self.length_penalty}")

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
        return replace(self.vad, max_speech_duration_s=min(self.vad.max_speech_duration_s, 30.0))
