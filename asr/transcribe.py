"""Transcription of audio of any length: openai-whisper's sequential algorithm, with assisted decoding.

Each 30 s window is encoded once; the decoder (with the assistant's drafts when there is one) produces
timestamped segments; the next window starts at the end of the last complete segment.
"""

from __future__ import annotations

import logging
import time
from typing import Callable, Protocol

import numpy as np
import torch

from asr.assistants import WindowContext
from asr.alignment import add_word_timestamps
from asr.decoder import WhisperDecoderAdapter, detect_language, encode
from asr.logit_rules import whisper_filters
from asr.options import TranscribeOptions
from asr.results import Segment, Transcript, TranscriptionStats
from asr.window import FallbackRules, WindowResult, decode_with_fallback, no_speech_skip
from audio import HOP_LENGTH, N_FRAMES, N_SAMPLES, SAMPLE_RATE, load_audio, log_mel
from decoding import DraftSource

logger = logging.getLogger(__name__)

# Whisper's timestamps are 0.02 s apart: two mel frames per encoder position.
TIME_PRECISION = 0.02
INPUT_STRIDE = 2


class WindowAssistant(Protocol):
    """An assistant for Whisper (see `asr.assistants`): gives a draft source for each window."""

    name: str

    def for_window(self, window: WindowContext) -> tuple[DraftSource, float]:
        """Returns the window's draft source and the seconds spent encoding for it (0 when it shares the encoder)."""


def resolve_language(code: str | None, bundle) -> str | None:
    """Turns a language code or name ("de", "German") into a code the model knows.

    Raises:
        ValueError: an unknown language, or any language but English for an English-only model.
    """
    if code is None:
        return None if bundle.is_multilingual else "en"
    from transformers.models.whisper.tokenization_whisper import TO_LANGUAGE_CODE

    key = code.strip().lower()
    key = TO_LANGUAGE_CODE.get(key, key)
    known = bundle.special.languages
    if not bundle.is_multilingual:
        if key != "en":
            raise ValueError(f"model {bundle.name} is English-only; it cannot transcribe language {code!r}")
        return "en"
    if key not in known:
        raise ValueError(f"unknown language {code!r}; use a code such as {', '.join(list(known)[:8])}, ...")
    return key


def transcribe(
    bundle,
    audio: str | np.ndarray,
    options: TranscribeOptions = TranscribeOptions(),
    assistant: WindowAssistant | None = None,
    progress: Callable[[float, float], None] | None = None,
) -> Transcript:
    """Transcribes (or translates) a file or a 16 kHz mono float32 array of any length.

    Args:
        bundle: a loaded model (`asr.registry.load_model`).
        audio: a path, or samples at 16 kHz.
        options: what to produce and how.
        assistant: drafts tokens for the model to check; None for plain decoding. The words are the model's either way.
        progress: called with (seconds done, seconds in all) after each window.

    Returns:
        Text, language, segments and statistics.

    Raises:
        audio.AudioError: the audio cannot be read.
        ValueError: options the model cannot honour (an unknown language, translation with an English-only model).
    """
    start = time.perf_counter()
    language = resolve_language(options.language, bundle)
    if options.task == "translate" and not bundle.is_multilingual:
        raise ValueError(f"model {bundle.name} is English-only; it cannot translate")
    samples = load_audio(audio)
    stats = TranscriptionStats(audio_seconds=len(samples) / SAMPLE_RATE)
    windows = _WindowDecoder(bundle, options, assistant, stats, language)
    tokenizer = bundle.tokenizer

    all_tokens: list[int] = []
    if options.initial_prompt:
        all_tokens = tokenizer.encode(" " + options.initial_prompt.strip(), add_special_tokens=False)
    prompt_reset_since = 0
    segments: list[Segment] = []
    content_frames = len(samples) // HOP_LENGTH
    seek = 0
    while seek < content_frames:
        window = samples[seek * HOP_LENGTH: seek * HOP_LENGTH + N_SAMPLES]
        segment_size = min(N_FRAMES, content_frames - seek)
        advance = segment_size
        if not _is_silent(window[: segment_size * HOP_LENGTH], options.silence_threshold_db):
            previous = _previous_text(all_tokens[prompt_reset_since:], bundle)
            window_segments, advance, temperature = windows.decode(window, previous, seek, segment_size)
            for segment in window_segments:
                segment.id = len(segments)
                segments.append(segment)
                all_tokens.extend(segment.tokens)
            if not options.condition_on_previous_text or temperature > 0.5:
                # A hot fallback means the previous text may be off; don't let it steer the next window.
                prompt_reset_since = len(all_tokens)
        seek += advance
        if progress is not None:
            progress(min(seek, content_frames) * HOP_LENGTH / SAMPLE_RATE, stats.audio_seconds)

    stats.total_seconds = time.perf_counter() - start
    text = "".join(segment.text for segment in segments)
    return Transcript(text, windows.language or "en", segments, stats, windows.language_probs)


class _WindowDecoder:
    """Decodes one 30 s window at a time: encoder, language detection, assisted decoding, segments, words."""

    def __init__(self, bundle, options: TranscribeOptions, assistant: WindowAssistant | None,
                 stats: TranscriptionStats, language: str | None) -> None:
        self.bundle = bundle
        self.options = options
        self.assistant = assistant
        self.stats = stats
        self.language = language
        self.language_probs: dict[str, float] | None = None
        self.rules = FallbackRules(options.temperatures, options.compression_ratio_threshold,
                                   options.logprob_threshold, options.no_speech_threshold)

    def decode_text(self, tokens: list[int]) -> str:
        return self.bundle.tokenizer.decode(tokens)

    def decode(self, window: np.ndarray, previous: list[int], seek: int,
               segment_size: int) -> tuple[list[Segment], int, float]:
        """Returns the window's segments, how many mel frames to advance, and the temperature that was kept."""
        bundle, options, special, stats = self.bundle, self.options, self.bundle.special, self.stats

        # 1. Encode the window once, for the model and (when it shares the encoder) the assistant.
        t = time.perf_counter()
        features = log_mel(window, bundle.n_mels)
        encoder_output = encode(bundle.model, features)
        stats.encode_seconds += time.perf_counter() - t
        if self.language is None:
            self.language, self.language_probs = detect_language(bundle.model, encoder_output, special.sot,
                                                                 special.languages)
            logger.info("detected language %s (p=%.2f)", self.language, self.language_probs[self.language])

        # 2. Decode with fallback, conditioned on the previous text; the assistant drafts (its encoder runs once).
        prompt, sot_index = _prompt(bundle, self.language, options, previous)
        filters = whisper_filters(
            suppress_tokens=special.suppress_tokens, begin_suppress_tokens=special.begin_suppress_tokens,
            sample_begin=len(prompt), timestamps=options.timestamps, eot=special.eot,
            no_timestamps=special.no_timestamps, timestamp_begin=special.timestamp_begin,
        )
        draft = None
        if self.assistant is not None:
            draft, assistant_encode_seconds = self.assistant.for_window(WindowContext(
                features, encoder_output, prompt, filters, previous, self.language, options.task, options.timestamps))
            stats.encode_seconds += assistant_encode_seconds
        t = time.perf_counter()
        result = decode_with_fallback(
            WhisperDecoderAdapter(bundle.model, encoder_output), prompt, rules=self.rules, filters=filters,
            draft=draft, eot=special.eot, no_speech=special.no_speech, sot_index=sot_index,
            decode_text=self.decode_text, max_new_tokens=options.max_new_tokens, schedule=options.schedule,
            num_assistant_tokens=options.num_assistant_tokens,
            seed=None if options.seed is None else options.seed + seek, stats=stats.generation,
        )
        stats.decode_seconds += time.perf_counter() - t
        stats.windows += 1
        if no_speech_skip(result, self.rules):
            return [], segment_size, result.temperature

        # 3. Cut the window into segments; word times come from one more pass of the model over the final tokens.
        time_offset = seek * HOP_LENGTH / SAMPLE_RATE
        segments, advance = _split_segments(result, special.timestamp_begin, special.eot, seek, time_offset,
                                            segment_size, segment_size * HOP_LENGTH / SAMPLE_RATE, self.decode_text)
        if options.word_timestamps and segments:
            t = time.perf_counter()
            add_word_timestamps(
                segments, model=bundle.model, tokenizer=bundle.tokenizer, encoder_output=encoder_output,
                start_sequence=prompt[sot_index:] + [special.no_timestamps],  # word times need timestamps on
                eot=special.eot, num_frames=segment_size, time_offset=time_offset,
                alignment_heads=bundle.alignment_heads, language=self.language,
            )
            stats.decode_seconds += time.perf_counter() - t
        return segments, advance, result.temperature


def _is_silent(samples: np.ndarray, threshold_db: float | None) -> bool:
    """True when the samples never reach `threshold_db` dBFS."""
    if threshold_db is None or samples.size == 0:
        return threshold_db is not None
    return float(np.abs(samples).max()) < 10.0 ** (threshold_db / 20.0)


def _previous_text(tokens: list[int], bundle) -> list[int]:
    """The tail of the previous text that fits in the prompt: half the decoder context (openai-whisper's limit)."""
    return tokens[-(bundle.model.config.max_target_positions // 2 - 1):] if tokens else []


def _prompt(bundle, language: str, options: TranscribeOptions, previous: list[int]) -> tuple[list[int], int]:
    """The decoder prompt: previous text after <|startofprev|>, then the start-of-transcript sequence."""
    special = bundle.special
    prompt: list[int] = [special.prev] + previous if previous else []
    sot_index = len(prompt)
    prompt.append(special.sot)
    if bundle.is_multilingual:
        task = special.translate if options.task == "translate" else special.transcribe
        prompt += [special.languages[language], task]
    if not options.timestamps:
        prompt.append(special.no_timestamps)
    return prompt, sot_index


def _split_segments(result: WindowResult, timestamp_begin: int, eot: int, seek: int, time_offset: float,
                    segment_size: int, segment_duration: float, decode_text) -> tuple[list[Segment], int]:
    """openai-whisper's segmentation of one window's tokens at consecutive timestamp pairs.

    Returns:
        (the window's segments, how many mel frames to advance).
    """
    tokens = result.tokens
    is_timestamp = [t >= timestamp_begin for t in tokens]
    single_timestamp_ending = is_timestamp[-2:] == [False, True]
    consecutive = [i + 1 for i in range(len(tokens) - 1) if is_timestamp[i] and is_timestamp[i + 1]]

    def make(start: float, end: float, seg_tokens: list[int]) -> Segment:
        text = decode_text([t for t in seg_tokens if t < eot])
        return Segment(0, seek, round(start, 3), round(end, 3), text, seg_tokens, result.temperature,
                       result.avg_logprob, result.compression_ratio, result.no_speech_prob)

    segments: list[Segment] = []
    if consecutive:
        slices = consecutive + ([len(tokens)] if single_timestamp_ending else [])
        last = 0
        for current in slices:
            piece = tokens[last:current]
            start = time_offset + (piece[0] - timestamp_begin) * TIME_PRECISION
            end = time_offset + (piece[-1] - timestamp_begin) * TIME_PRECISION
            segments.append(make(start, end, piece))
            last = current
        if single_timestamp_ending:
            advance = segment_size
        else:
            # The window ended inside speech: resume at the last complete segment's end.
            advance = (tokens[last - 1] - timestamp_begin) * INPUT_STRIDE or segment_size
    else:
        duration = segment_duration
        timestamps = [t for t in tokens if t >= timestamp_begin]
        if timestamps and timestamps[-1] != timestamp_begin:
            duration = (timestamps[-1] - timestamp_begin) * TIME_PRECISION
        segments.append(make(time_offset, time_offset + duration, tokens))
        advance = segment_size
    # An instantaneous segment or one without text carries no words.
    kept = []
    for segment in segments:
        if segment.start == segment.end or not segment.text.strip():
            continue
        kept.append(segment)
    return kept, advance
