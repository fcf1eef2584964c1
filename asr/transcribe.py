"""Transcription of audio of any length: openai-whisper's sequential algorithm, with assisted decoding.

Each 30 s window is encoded once; the decoder (with the assistant's drafts when there is one) produces
timestamped segments; the next window starts at the end of the last complete segment. Several files are
transcribed together by decoding their current windows as one batch; a file that finishes makes room for
the next (continuous batching at window granularity).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Callable, Iterable, Protocol, Sequence

import numpy as np
import torch

from asr.alignment import add_word_timestamps
from asr.chunks import SpeechMap
from asr.decoder import WhisperDecoderAdapter
from asr.language import check_task, detect_languages, resolve_language
from asr.logit_rules import whisper_filters
from asr.options import TranscribeOptions
from asr.results import Segment, Transcript, TranscriptionStats
from asr.window import (
    FallbackRules,
    WindowContext,
    WindowSettings,
    decode_windows,
    encode,
    no_speech_skip,
    split_segments,
)
from audio import HOP_LENGTH, N_FRAMES, N_SAMPLES, SAMPLE_RATE, load_audio, log_mel
from audio.vad import speech_regions
from decoding import DraftSource

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class DecodedWindow:
    """One window as the model decoded it: what `window_observer` receives (to train a draft on, say)."""

    audio_index: int  # which of the audios given to `transcribe_many`
    encoder_output: torch.Tensor  # [1500, d_model] the model's encoder output
    prompt: list[int]  # the decoder prompt (previous text, start-of-transcript sequence)
    tokens: list[int]  # the generated tokens, end-of-text excluded
    temperature: float  # 0.0 for greedy; higher after a fallback


class WindowAssistant(Protocol):
    """An assistant for Whisper (`asr.assist.assistants` has every kind)."""

    name: str

    def prepare(self, windows: list[WindowContext]) -> tuple[Callable[[list[int]], DraftSource], float]:
        """Readies a batch of windows (running its own encoder once if it has one).

        Returns:
            A function from window indices to a draft source for those windows (called again for temperature
            fallbacks), and the seconds spent encoding (0 when it shares the model's encoder).
        """


def transcribe(
    bundle,
    audio: str | bytes | np.ndarray,
    options: TranscribeOptions = TranscribeOptions(),
    assistant: WindowAssistant | None = None,
    progress: Callable[[float, float], None] | None = None,
) -> Transcript:
    """Transcribes (or translates) a file or a 16 kHz mono float32 array of any length.

    By default with openai-whisper's sequential algorithm over the whole audio; `options.vad` keeps only the
    speech that Silero VAD finds, and `options.batch_size` decodes 30 s speech chunks that many at a time.

    Args:
        bundle: a loaded model (`asr.models.registry.load_model`).
        audio: a path, a file's bytes, or mono samples at 16 kHz. For one channel of a stereo recording (each
            side of a call), pass `audio.load_audio(path, channel=0)` (left) or `channel=1` (right).
        options: what to produce and how.
        assistant: drafts tokens for the model to check; None for plain decoding. The words are the model's either way.
        progress: called with (seconds done, seconds in all) after each window.

    Returns:
        Text, language, segments and statistics.

    Raises:
        audio.AudioError: the audio cannot be read.
        ValueError: options the model cannot honour (an unknown language, translation with an English-only model),
            or an assistant with beam search (`options.beam_size` > 1 decodes with the model alone).
    """
    return transcribe_many(bundle, [audio], options, assistant, batch_size=1, progress=progress)[0]


def transcribe_many(
    bundle,
    audios: Sequence[str | np.ndarray],
    options: TranscribeOptions = TranscribeOptions(),
    assistant: WindowAssistant | None = None,
    batch_size: int = 8,
    progress: Callable[[float, float], None] | None = None,
    window_observer: Callable[[DecodedWindow], None] | None = None,
) -> list[Transcript]:
    """Transcribes several audios, decoding up to `batch_size` windows (one per audio) at a time.

    Each transcript holds the words `transcribe` gives for that audio alone (greedy decoding; batched and
    single kernels may differ in the last bits of a float). Statistics of shared passes are split evenly.
    `window_observer`, when given, sees every decoded window (its encoder output, prompt and tokens).
    With `options.batch_size` set, the audios' speech chunks are decoded that many at a time instead, all
    audios' chunks sharing the batches (`asr.chunked`); `batch_size` is then unused.

    Raises:
        audio.AudioError: an audio cannot be read (decode files first to handle them one by one).
        ValueError: as for `transcribe`, or batch_size < 1.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    language = resolve_language(options.language, bundle)
    check_task(options.task, bundle)
    initial = []
    if options.initial_prompt:
        initial = bundle.tokenizer.encode(" " + options.initial_prompt.strip(), add_special_tokens=False)
    samples = [load_audio(audio) for audio in audios]
    decoder = _WindowDecoder(bundle, options, assistant, window_observer)
    if options.batch_size is not None:
        from asr.chunked import transcribe_chunked

        return transcribe_chunked(decoder, samples, language, initial, progress)
    items = [_sequential_item(index, audio, language, options, initial) for index, audio in enumerate(samples)]

    def report(_: list[_Item]) -> None:
        if progress is not None and len(items) == 1:
            progress(items[0].done_seconds, items[0].stats.audio_seconds)

    decode_items(decoder, items, batch_size, after_batch=report)
    return [item.transcript() for item in items]


def decode_items(decoder: _WindowDecoder, items: Iterable[_Item], batch_size: int,
                 after_batch: Callable[[list[_Item]], None] | None = None,
                 on_finished: Callable[[_Item], None] | None = None) -> None:
    """Decodes the items' windows, up to `batch_size` items at a time, until every item is done.

    Items are taken from `items` only as places in the batch free up (so they can be made lazily); an item
    that finishes leaves the batch before the next decode and a waiting one takes its place.

    Args:
        decoder: the window decoder.
        items: the items, taken in order.
        batch_size: most items decoded together.
        after_batch: called with the batch after each decode.
        on_finished: called once with each item when it has no window left.
    """
    waiting = iter(items)
    active: list[_Item] = []
    while True:
        still = []
        for item in active:
            if item.next_window():
                still.append(item)
            elif on_finished is not None:
                on_finished(item)
        active = still
        while len(active) < batch_size and (item := next(waiting, None)) is not None:
            if item.next_window():
                active.append(item)
            elif on_finished is not None:
                on_finished(item)
        if not active:
            return
        decoder.decode(active)
        if after_batch is not None:
            after_batch(active)


def _sequential_item(index: int, samples: np.ndarray, language: str | None, options: TranscribeOptions,
                     initial: list[int]) -> _Item:
    """An audio's item for the sequential algorithm: all of it, or with `options.vad` its speech only."""
    if options.vad is None:
        return _Item(index, samples, language, options, initial)
    start = time.perf_counter()
    speech_map = SpeechMap(speech_regions(samples, options.vad))
    item = _Item(index, speech_map.speech(samples), language, options, initial, speech_map)
    item.start = start
    item.stats.audio_seconds = len(samples) / SAMPLE_RATE
    item.stats.vad_seconds = time.perf_counter() - start
    logger.info("VAD: %.1f s of speech in %.1f s", len(item.samples) / SAMPLE_RATE, item.stats.audio_seconds)
    return item


class _Item:
    """One audio's progress through the sequential algorithm."""

    def __init__(self, index: int, samples: np.ndarray, language: str | None, options: TranscribeOptions,
                 initial_prompt: list[int], speech_map: SpeechMap | None = None) -> None:
        self.index = index
        self.start = time.perf_counter()
        # With VAD, `samples` is the speech only; the map gives times in the recording.
        self.speech_map = speech_map
        self.samples = samples
        self.options = options
        self.language = language
        self.language_probs: dict[str, float] | None = None
        self.stats = TranscriptionStats(audio_seconds=len(samples) / SAMPLE_RATE)
        self.content_frames = len(samples) // HOP_LENGTH
        self.seek = 0
        self.segment_size = 0
        self.segments: list[Segment] = []
        self.all_tokens: list[int] = list(initial_prompt)  # the initial prompt conditions the first window
        self.prompt_reset_since = 0
        self.finished_at: float | None = None

    @property
    def done_seconds(self) -> float:
        done = min(self.seek, self.content_frames) * HOP_LENGTH / SAMPLE_RATE
        if self.speech_map is not None:
            return self.stats.audio_seconds if self.seek >= self.content_frames else self.speech_map.original_time(done)
        return done

    @property
    def window(self) -> np.ndarray:
        return self.samples[self.seek * HOP_LENGTH: self.seek * HOP_LENGTH + N_SAMPLES]

    def next_window(self) -> bool:
        """Moves to the next window worth decoding (silent ones are skipped); False when the audio is done."""
        while self.seek < self.content_frames:
            self.segment_size = min(N_FRAMES, self.content_frames - self.seek)
            if not _is_silent(self.window[: self.segment_size * HOP_LENGTH], self.options.silence_threshold_db):
                return True
            self.seek += self.segment_size
        if self.finished_at is None:
            self.finished_at = time.perf_counter()
        return False

    def previous(self, bundle) -> list[int]:
        return _previous_text(self.all_tokens[self.prompt_reset_since:], bundle)

    def consume(self, segments: list[Segment], advance: int, temperature: float) -> None:
        for segment in segments:
            segment.id = len(self.segments)
            self.segments.append(segment)
            self.all_tokens.extend(segment.tokens)
        if not self.options.condition_on_previous_text or temperature > 0.5:
            # A hot fallback means the previous text may be off; don't let it steer the next window.
            self.prompt_reset_since = len(self.all_tokens)
        self.seek += advance

    def transcript(self) -> Transcript:
        if self.speech_map is not None:
            self.speech_map.restore(self.segments)
            self.speech_map = None
        self.stats.total_seconds = (self.finished_at or time.perf_counter()) - self.start
        text = "".join(segment.text for segment in self.segments)
        return Transcript(text, self.language or "en", self.segments, self.stats, self.language_probs)


class _WindowDecoder:
    """Decodes the current window of several items at once: encoder, language, assisted decoding, segments, words."""

    def __init__(self, bundle, options: TranscribeOptions, assistant: WindowAssistant | None,
                 observer: Callable[[DecodedWindow], None] | None = None) -> None:
        self.bundle = bundle
        self.options = options
        self.assistant = assistant
        self.observer = observer
        if options.beam_search and assistant is not None:
            raise ValueError("beam search decodes with the model alone: pass no assistant, or beam size 1")
        self.rules = FallbackRules(options.temperatures, options.compression_ratio_threshold,
                                   options.logprob_threshold, options.no_speech_threshold)
        schedule, num_assistant_tokens = options.drafting(getattr(assistant, "schedule", None))
        self.settings = WindowSettings(self.rules, bundle.special, self.decode_text, options.max_new_tokens,
                                       schedule, num_assistant_tokens, beam_size=options.beam_size or 1,
                                       patience=options.patience, length_penalty=options.length_penalty,
                                       best_of=options.best_of or 1)

    def decode_text(self, tokens: list[int]) -> str:
        return self.bundle.tokenizer.decode(tokens)

    def detect_language(self, window: np.ndarray) -> tuple[str, dict[str, float]]:
        """The language of one window of samples, and the probability of each language code."""
        features = log_mel([window], self.bundle.n_mels)
        decoder = WhisperDecoderAdapter(self.bundle.model, encode(self.bundle.model, features))
        (language, probs), = detect_languages(decoder.rows([0]), self.bundle.special)
        logger.info("detected language %s (p=%.2f)", language, probs[language])
        return language, probs

    def decode(self, items: list[_Item]) -> None:
        bundle, options, special = self.bundle, self.options, self.bundle.special
        share = 1.0 / len(items)

        # 1. Encode the windows once, for the model and (when it shares the encoder) the assistant.
        t = time.perf_counter()
        features = log_mel([item.window for item in items], bundle.n_mels)
        encoder_output = encode(bundle.model, features)
        model_decoder = WhisperDecoderAdapter(bundle.model, encoder_output)
        undetected = [i for i, item in enumerate(items) if item.language is None]
        if undetected:
            found = detect_languages(model_decoder.rows(undetected), special)
            for i, (language, probs) in zip(undetected, found):
                items[i].language, items[i].language_probs = language, probs
                logger.info("detected language %s (p=%.2f)", language, probs[language])
        elapsed = time.perf_counter() - t

        # 2. Decode with fallback, conditioned on the previous text; the assistant drafts (its encoder runs once).
        previous = [item.previous(bundle) for item in items]
        prompts, filters = [], []
        for item, prev in zip(items, previous):
            prompt, sot_index = special.prompt(prev, item.language, options.task, options.timestamps)
            # <|startoftranscript|> sits as far from the end of every prompt (a negative index).
            sot_from_end = sot_index - len(prompt)
            prompts.append(prompt)
            filters.append(whisper_filters(special, len(prompt), options.timestamps))
        make_draft = None
        if self.assistant is not None:
            contexts = [WindowContext(features[i:i + 1], encoder_output[i:i + 1], prompts[i], filters[i], previous[i],
                                      item.language, options.task, options.timestamps) for i, item in enumerate(items)]
            make_draft, assistant_seconds = self.assistant.prepare(contexts)
            elapsed += assistant_seconds
        for item in items:
            item.stats.encode_seconds += elapsed * share
        t = time.perf_counter()
        decoded = decode_windows(model_decoder, prompts, filters, self.settings, make_draft=make_draft,
                                 sot_from_end=sot_from_end,
                                 seed=None if options.seed is None else options.seed + items[0].seek)
        elapsed = time.perf_counter() - t

        # 3. Cut each window into segments; word times come from one more pass of the model over the final tokens.
        for i, (item, (result, generation)) in enumerate(zip(items, decoded)):
            item.stats.generation.add(generation)
            item.stats.decode_seconds += elapsed * share
            item.stats.windows += 1
            if self.observer is not None:
                self.observer(DecodedWindow(item.index, encoder_output[i], prompts[i], result.tokens, result.temperature))
            if no_speech_skip(result, self.rules):
                item.consume([], item.segment_size, result.temperature)
                continue
            time_offset = item.seek * HOP_LENGTH / SAMPLE_RATE
            segments, advance = split_segments(result, special, item.seek, item.segment_size, self.decode_text)
            if options.word_timestamps and segments:
                t = time.perf_counter()
                sot_index = len(prompts[i]) + sot_from_end
                # openai-whisper's alignment pass: the start sequence, <|notimestamps|> (once), the text tokens.
                start_sequence = [t for t in prompts[i][sot_index:] if t != special.no_timestamps]
                start_sequence.append(special.no_timestamps)
                add_word_timestamps(segments, bundle, encoder_output[i:i + 1], start_sequence, item.segment_size,
                                    time_offset, item.language)
                item.stats.decode_seconds += time.perf_counter() - t
            item.consume(segments, advance, result.temperature)


def _is_silent(samples: np.ndarray, threshold_db: float | None) -> bool:
    """True when the samples never reach `threshold_db` dBFS."""
    if threshold_db is None or samples.size == 0:
        return threshold_db is not None
    return float(np.abs(samples).max()) < 10.0 ** (threshold_db / 20.0)


def _previous_text(tokens: list[int], bundle) -> list[int]:
    """The tail of the previous text that fits in the prompt: half the decoder context (openai-whisper's limit)."""
    return tokens[-(bundle.model.config.max_target_positions // 2 - 1):] if tokens else []
