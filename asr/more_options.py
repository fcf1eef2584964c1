"""openai-whisper's and faster-whisper's further options: their checks, and what they mean for a model.

`TranscribeOptions` holds the values; this module checks them (one-line ValueErrors), parses their text forms
(`"-1,50257"`, `"0,5.5,10,20"`), resolves the suppress list against a model's vocabulary, turns clip
timestamps into mel frames, and tokenizes the prompt texts (initial prompt, prefix, hotwords).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from audio.constants import HOP_LENGTH, SAMPLE_RATE

if TYPE_CHECKING:
    from asr.options import TranscribeOptions

FRAMES_PER_SECOND = SAMPLE_RATE // HOP_LENGTH


def parse_suppress_tokens(text: str) -> tuple[int, ...]:
    """"-1,50257" -> (-1, 50257); "" -> () (nothing suppressed beyond Whisper's special tokens).

    Raises:
        ValueError: a part that is not an integer.
    """
    try:
        return tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise ValueError(f"suppress tokens must be integer ids separated by commas, got {text!r}") from None


def parse_clip_timestamps(text: str) -> tuple[float, ...]:
    """"0,5.5,10" -> (0.0, 5.5, 10.0): openai-whisper's "start,end,start,end,..." in seconds.

    Raises:
        ValueError: a part that is not a number.
    """
    try:
        return tuple(float(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise ValueError(f"clip timestamps must be seconds separated by commas (start,end,...), got {text!r}") from None


def check_options(options: TranscribeOptions) -> None:
    """Normalizes text forms (in place) and checks the values of the further options.

    Raises:
        ValueError: a value out of range, or options that do not go together.
    """
    if isinstance(options.suppress_tokens, str):
        object.__setattr__(options, "suppress_tokens", parse_suppress_tokens(options.suppress_tokens))
    if isinstance(options.clip_timestamps, str):
        object.__setattr__(options, "clip_timestamps", parse_clip_timestamps(options.clip_timestamps))
    object.__setattr__(options, "suppress_tokens", tuple(int(t) for t in options.suppress_tokens))
    object.__setattr__(options, "clip_timestamps", tuple(float(t) for t in options.clip_timestamps))
    if options.compression_ratio_threshold is not None and options.compression_ratio_threshold <= 0:
        raise ValueError(f"compression ratio threshold must be > 0, got {options.compression_ratio_threshold}")
    if options.logprob_threshold is not None and options.logprob_threshold > 0:
        raise ValueError(f"log-probability threshold must be <= 0 (log-probabilities are), got {options.logprob_threshold}")
    if options.no_speech_threshold is not None and not 0 <= options.no_speech_threshold <= 1:
        raise ValueError(f"no-speech threshold must be a probability in [0, 1], got {options.no_speech_threshold}")
    if any(t < -1 for t in options.suppress_tokens):
        raise ValueError(f"suppress tokens must be token ids (or -1 for the model's list), got {options.suppress_tokens}")
    clips = options.clip_timestamps
    if any(t < 0 for t in clips):
        raise ValueError(f"clip timestamps must be >= 0 seconds, got {clips}")
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


def suppress_list(options: TranscribeOptions, bundle) -> tuple[int, ...] | None:
    """The ids to suppress at every step; None for the model's own list (the default, `-1` alone).

    As openai-whisper: -1 adds the model's list, and Whisper's task, start and no-speech tokens are always added.

    Raises:
        ValueError: an id outside the model's vocabulary.
    """
    ids = options.suppress_tokens
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


def check_for_model(options: TranscribeOptions, bundle) -> tuple[int, ...] | None:
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


def prompt_texts(options: TranscribeOptions, bundle) -> PromptTexts:
    """Tokenizes the initial prompt, the prefix and the hotwords as openai-whisper and faster-whisper do
    (a leading space, at most half the decoder context for the prefix and the hotwords)."""
    half = bundle.model.config.max_target_positions // 2 - 1

    def encode(text: str | None) -> list[int]:
        return bundle.tokenizer.encode(" " + text.strip(), add_special_tokens=False) if text else []

    return PromptTexts(encode(options.initial_prompt), encode(options.prefix)[:half], encode(options.hotwords)[:half])
