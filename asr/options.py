"""Options of a transcription, grouped by purpose (after openai-whisper's DecodingOptions)."""

from __future__ import annotations

from dataclasses import dataclass

from decoding.schedule import make_schedule

TASKS = ("transcribe", "translate")
# Drafting when neither the options nor the assistant say otherwise: the seeds' heuristic, from 5 drafts.
DEFAULT_SCHEDULE = ("heuristic", 5)


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
    # Most tokens decoded in one window (openai-whisper: half the decoder's context).
    max_new_tokens: int = 224
    # Drafting: schedule (heuristic, constant, confidence) and its starting k. None: the assistant's own
    # preference (`--assistant auto` for an offloaded model drafts many tokens a round), else heuristic from 5.
    schedule: str | None = None
    num_assistant_tokens: int | None = None
    # Seed for sampled (fallback) windows, for reproducible runs.
    seed: int | None = 0

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise ValueError(f"unknown task {self.task!r}; choose one of {', '.join(TASKS)}")
        if not self.temperatures or any(t < 0 for t in self.temperatures):
            raise ValueError(f"temperatures must be a non-empty list of values >= 0, got {self.temperatures}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.word_timestamps and not self.timestamps:
            raise ValueError("word timestamps need timestamps; drop --without-timestamps")
        make_schedule(*self.drafting())

    def drafting(self, preferred: tuple[str, int] | None = None) -> tuple[str, int]:
        """(schedule, k): what was asked for, else the assistant's `preferred` drafting, else DEFAULT_SCHEDULE."""
        schedule, k = preferred or DEFAULT_SCHEDULE
        return (schedule if self.schedule is None else self.schedule,
                k if self.num_assistant_tokens is None else self.num_assistant_tokens)
