"""Transcription of audio of any length: openai-whisper's sequential algorithm, with assisted decoding.

Each 30 s window is encoded once; the decoder (with the assistant's drafts when there is one) produces
timestamped segments; the next window starts at the end of the last complete segment. Several files are
transcribed together by decoding their current windows as one batch; a file that finishes makes room for
the next (continuous batching at window granularity).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace
from typing import Callable, Iterable, Protocol, Sequence

import numpy as np
import torch

from asr.items import _Item, sequential_item
from asr.models.precision import pack_for_rows
from asr.options import TranscribeOptions, check_for_model, prompt_texts
from asr.results import Transcript
from asr.whisper.alignment import add_word_timestamps
from asr.whisper.decoder import WhisperDecoderAdapter
from asr.whisper.language import check_task, resolve_language
from asr.whisper.logit_rules import whisper_filters
from asr.whisper.window import (
    FallbackRules,
    WindowContext,
    WindowSettings,
    decode_windows,
    encode,
    no_speech_skip,
    split_segments,
)
from audio import HOP_LENGTH, SAMPLE_RATE, load_audio, log_mel
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
    language, initial, decoder = prepare(bundle, options, assistant, window_observer)
    samples = [load_audio(audio) for audio in audios]
    if options.batch_size is not None:
        from asr.chunked import transcribe_chunked

        return transcribe_chunked(decoder, samples, language, initial, progress)
    items = [sequential_item(index, audio, language, options, initial) for index, audio in enumerate(samples)]

    def report(_: list[_Item]) -> None:
        if progress is not None and len(items) == 1:
            progress(items[0].done_seconds, items[0].stats.audio_seconds)

    decode_items(decoder, items, batch_size, after_batch=report)
    return [item.transcript() for item in items]


def prepare(bundle, options: TranscribeOptions, assistant: WindowAssistant | None = None,
            window_observer: Callable[[DecodedWindow], None] | None = None) -> tuple[str | None, list[int], _WindowDecoder]:
    """Checks the options against the model; returns (the language or None, the initial prompt's tokens, the decoder)."""
    language = resolve_language(options.language, bundle)
    check_task(options.task, bundle)
    decoder = _WindowDecoder(bundle, options, assistant, window_observer)
    return language, decoder.texts.initial, decoder


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
        self.suppress = check_for_model(options, bundle)
        self.texts = prompt_texts(options, bundle)

    def decode_text(self, tokens: list[int]) -> str:
        return self.bundle.tokenizer.decode(tokens)

    def detect_language(self, samples: np.ndarray) -> tuple[str, dict[str, float]]:
        """The language of the start of `samples` (its first window, or as many as the options say), and the
        probability of each language code."""
        from asr.whisper.language import detect_language

        return detect_language(self.bundle, samples, self.options.language_detection_segments,
                               self.options.language_detection_threshold)

    def decode(self, items: list[_Item]) -> None:
        bundle, options, special = self.bundle, self.options, self.bundle.special
        share = 1.0 / len(items)

        # 1. Encode the windows once, for the model and (when it shares the encoder) the assistant.
        t = time.perf_counter()
        features = log_mel([item.window for item in items], bundle.n_mels,
                           floors=[item.floor(bundle.n_mels) for item in items])
        encoder_output = encode(bundle.model, features)
        if len(items) > 1 or self.assistant is not None or self.settings.beam_size > 1:
            pack_for_rows(bundle.model)  # passes of several rows from here on
        model_decoder = WhisperDecoderAdapter(bundle.model, encoder_output)
        from asr.whisper.language import detect_items

        detect_items(self, items, model_decoder)
        elapsed = time.perf_counter() - t

        # 2. Decode with fallback, conditioned on the previous text; the assistant drafts (its encoder runs once).
        previous, prompts, filters, forced, sot_ends = [], [], [], [], []
        languages = _prompt_languages(items, options)
        for item, language in zip(items, languages):
            prev, prefix = item.previous(bundle), []
            if self.texts.prefix and item.prefix_pending:
                prefix = self.texts.prefix
            elif self.texts.hotwords:  # faster-whisper: hotwords go where the previous text goes, first
                room = bundle.model.config.max_target_positions // 2 - 1 - len(self.texts.hotwords)
                prev = self.texts.hotwords + (prev[-room:] if room > 0 else [])
            prompt, sot_index = special.prompt(prev, language, options.task, options.timestamps, prefix)
            # Tokens the output is forced to start with (<|0.00|> and the prefix): the rules see them as generated.
            start = len(prompt) - (len(prefix) + options.timestamps if prefix else 0)
            previous.append(prev)
            prompts.append(prompt)
            forced.append(prompt[start:])
            # <|startoftranscript|> sits this far from the end of the prompt (a negative index).
            sot_ends.append(sot_index - len(prompt))
            filters.append(whisper_filters(special, start, options.timestamps, suppress_tokens=self.suppress))
        make_draft = None
        if self.assistant is not None:
            contexts = [WindowContext(features[i:i + 1], encoder_output[i:i + 1], prompts[i], filters[i], previous[i],
                                      language, options.task, options.timestamps, forced[i])
                        for i, language in enumerate(languages)]
            make_draft, assistant_seconds = self.assistant.prepare(contexts)
            elapsed += assistant_seconds
        for item in items:
            item.stats.encode_seconds += elapsed * share
        t = time.perf_counter()
        decoded: list = [None] * len(items)
        # Windows whose start sequence is as far from the end of the prompt are decoded together (a prefix moves it).
        for sot_from_end in sorted(set(sot_ends)):
            rows = [i for i, s in enumerate(sot_ends) if s == sot_from_end]
            group_draft = None
            if make_draft is not None:
                group_draft = (lambda sub, rows=rows: make_draft([rows[r] for r in sub]))
            group = decode_windows(model_decoder if len(rows) == len(items) else model_decoder.rows(rows),
                                   [prompts[i] for i in rows], [filters[i] for i in rows], self.settings,
                                   make_draft=group_draft, sot_from_end=sot_from_end,
                                   seed=None if options.seed is None else options.seed + items[0].seek)
            for i, result in zip(rows, group):
                decoded[i] = result
        elapsed = time.perf_counter() - t

        # 3. Cut each window into segments; word times come from one more pass of the model over the final tokens.
        for i, (item, (result, generation)) in enumerate(zip(items, decoded)):
            item.stats.generation.add(generation)
            item.stats.decode_seconds += elapsed * share
            item.stats.windows += 1
            if self.observer is not None:
                self.observer(DecodedWindow(item.index, encoder_output[i], prompts[i], result.tokens, result.temperature))
            item.prefix_pending = False
            if no_speech_skip(result, self.rules):
                item.consume([], item.segment_size, result.temperature)
                continue
            if forced[i]:
                result = replace(result, tokens=forced[i] + result.tokens)
            time_offset = item.seek * HOP_LENGTH / SAMPLE_RATE
            segments, advance = split_segments(result, special, item.seek, item.segment_size, self.decode_text)
            if options.multilingual:
                for segment in segments:
                    segment.language = item.window_language
            if options.word_timestamps and segments:
                t = time.perf_counter()
                sot_index = len(prompts[i]) + sot_ends[i]
                # openai-whisper's alignment pass: the start sequence, <|notimestamps|> (once), the text tokens.
                start_sequence = [t for t in prompts[i][sot_index:len(prompts[i]) - len(forced[i])]
                                  if t != special.no_timestamps]
                start_sequence.append(special.no_timestamps)
                add_word_timestamps(segments, bundle, encoder_output[i:i + 1], start_sequence, item.segment_size,
                                    time_offset, item.window_language or item.language)
                item.stats.decode_seconds += time.perf_counter() - t
                if options.hallucination_silence_threshold is not None:
                    from asr.hallucination import skip_hallucinations

                    segments, advance = skip_hallucinations(item, result, segments, advance, special.timestamp_begin)
            item.consume(segments, advance, result.temperature)


def _prompt_languages(items: list[_Item], options: TranscribeOptions) -> list[str | None]:
    return [item.window_language if options.multilingual else item.language for item in items]
