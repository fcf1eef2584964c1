"""One batch of windows decoded: the encoder once, the language, each window's prompt, decoding with the
temperature fallback (the assistant's drafts where there is one), then the segments and their words.

`asr.transcription`'s paths (sequential and batched) and the server's scheduler share one `WindowDecoder` a run;
`decode_in_batches` keeps up to `batch_size` recordings' windows decoding together (continuous batching at window
granularity).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Protocol

import numpy as np
import torch

from asr.hallucination import after_words
from asr.models.precision import pack_for_rows
from asr.options import TranscribeOptions, check_for_model, prompt_room, prompt_texts
from asr.progress import AudioProgress
from asr.whisper.alignment import add_word_timestamps
from asr.whisper.decoder import WhisperDecoderAdapter
from asr.whisper.language import detect_language, detect_languages
from asr.whisper.logit_rules import whisper_filters
from asr.whisper.window import (
    FallbackRules,
    WindowContext,
    WindowResult,
    WindowSettings,
    decode_windows,
    encode,
    kept_segments,
    no_speech_skip,
    split_segments,
)
from audio import HOP_LENGTH, SAMPLE_RATE, log_mel
from decoding import DraftSource, LogitsFilter

if TYPE_CHECKING:
    from asr.models.registry import WhisperBundle

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class DecodedWindow:
    """One window as the model decoded it: what `window_observer` receives (to train a draft model on, say)."""

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


def decode_in_batches(decoder: WindowDecoder, waiting: Iterable[AudioProgress], batch_size: int,
                       on_finished: Callable[[AudioProgress], None] | None = None) -> Iterator[list[AudioProgress]]:
    """Decodes the audios' windows, up to `batch_size` audios at a time, until every audio is done; yields the
    batch after each decode.

    Audios are taken from `waiting` only as places in the batch free up (so they can be made lazily); one that
    finishes leaves the batch before the next decode (`on_finished` sees it) and a waiting one takes its place.
    """
    waiting = iter(waiting)
    active: list[AudioProgress] = []
    while True:
        active = [audio for audio in active if _has_window(audio, on_finished)]
        while len(active) < batch_size and (audio := next(waiting, None)) is not None:
            if _has_window(audio, on_finished):
                active.append(audio)
        if not active:
            return
        decoder.decode(active)
        yield active


def _has_window(audio: AudioProgress, on_finished: Callable[[AudioProgress], None] | None) -> bool:
    """Moves `audio` to its next window; False (after `on_finished`) when it has none left."""
    if audio.next_window():
        return True
    if on_finished is not None:
        on_finished(audio)
    return False


@dataclass
class _WindowPrompt:
    """One window's decoder input."""

    previous: list[int]  # the previous text in the prompt
    tokens: list[int]  # the whole prompt: previous text, start-of-transcript sequence, forced tokens
    forced: list[int]  # the prompt's last tokens, which the output is forced to start with (<|0.00|>, a prefix)
    sot_from_end: int  # where <|startoftranscript|> is, counted from the prompt's end (a negative index)
    filters: list[LogitsFilter]  # Whisper's logit rules for this prompt
    language: str | None  # the language in the prompt


class WindowDecoder:
    """Decodes the current window of several audios at once; what it needs is built once per run."""

    def __init__(self, bundle: WhisperBundle, options: TranscribeOptions, assistant: WindowAssistant | None,
                 observer: Callable[[DecodedWindow], None] | None = None) -> None:
        self.bundle = bundle
        self.options = options
        self.assistant = assistant
        self.observer = observer
        if options.beam_search and getattr(assistant, "chosen_by_auto", False):
            logger.info("beam search decodes with the model alone: --assistant auto drafts nothing")
            self.assistant = assistant = None
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
        self.prompt_room = prompt_room(bundle)

    def decode_text(self, tokens: list[int]) -> str:
        return self.bundle.tokenizer.decode(tokens)

    def detect_language(self, samples: np.ndarray) -> tuple[str, dict[str, float]]:
        """The language of the start of `samples` (its first window, or as many as the options say), and the
        probability of each language code."""
        return detect_language(self.bundle, samples, self.options.language_detection_segments,
                               self.options.language_detection_threshold)

    def decode(self, batch: list[AudioProgress]) -> None:
        """Decodes each audio's current window and moves the audio past what it decoded."""
        bundle, options = self.bundle, self.options
        share = 1.0 / len(batch)
        # What `--assistant auto` chose drafts for one window at a time: several windows a pass already read the
        # weights once for many tokens, and a draft only added steps there (docs/drafts.md).
        assistant = self.assistant if len(batch) == 1 or not getattr(self.assistant, "chosen_by_auto", False) else None

        # 1. Encode the windows once, for the model and (when it shares the encoder) the assistant; languages.
        t = time.perf_counter()
        features = log_mel([audio.window for audio in batch], bundle.n_mels,
                           floors=[audio.floor(bundle.n_mels) for audio in batch],
                           around=[audio.window_margins for audio in batch])
        encoder_output = encode(bundle.model, features)
        if len(batch) > 1 or assistant is not None or self.settings.beam_size > 1:
            pack_for_rows(bundle.model)  # passes of several rows from here on
        model_decoder = WhisperDecoderAdapter(bundle.model, encoder_output)
        self._detect_languages(batch, model_decoder)
        elapsed = time.perf_counter() - t
        windows = [self._prompt(audio) for audio in batch]
        make_draft = None
        if assistant is not None:
            contexts = [WindowContext(features[i:i + 1], encoder_output[i:i + 1], w.tokens, w.filters, w.previous,
                                      w.language, options.task, options.uses_timestamps, w.forced)
                        for i, w in enumerate(windows)]
            make_draft, assistant_seconds = assistant.prepare(contexts)
            elapsed += assistant_seconds
        for audio in batch:
            audio.stats.encode_seconds += elapsed * share

        # 2. Decode with fallback; windows whose start sequence is as far from the prompt's end go together.
        t = time.perf_counter()
        decoded: list = [None] * len(batch)
        for sot_from_end in sorted({w.sot_from_end for w in windows}):
            rows = [i for i, w in enumerate(windows) if w.sot_from_end == sot_from_end]
            group_draft = None
            if make_draft is not None:
                group_draft = (lambda sub, rows=rows: make_draft([rows[r] for r in sub]))
            group = decode_windows(model_decoder if len(rows) == len(batch) else model_decoder.rows(rows),
                                   [windows[i].tokens for i in rows], [windows[i].filters for i in rows],
                                   self.settings, make_draft=group_draft, sot_from_end=sot_from_end,
                                   seed=None if options.seed is None else options.seed + batch[0].seek)
            for i, result in zip(rows, group):
                decoded[i] = result
        elapsed = time.perf_counter() - t

        # 3. Cut each window into segments (word times from one more pass of the model over the final tokens).
        for i, (audio, window, (result, generation)) in enumerate(zip(batch, windows, decoded)):
            audio.stats.generation.add(generation)
            if assistant is not None:
                audio.stats.assistant = assistant.name
            audio.stats.decode_seconds += elapsed * share
            audio.stats.windows += 1
            if self.observer is not None:
                self.observer(DecodedWindow(audio.index, encoder_output[i], window.tokens, result.tokens,
                                            result.temperature))
            self._segments(audio, window, result, model_decoder, i)

    def _detect_languages(self, batch: list[AudioProgress], model_decoder: WhisperDecoderAdapter) -> None:
        """Sets the language of audios that have none (and, multilingual, of every audio's current window).

        One window each from the batch's encoder output; several windows of the audio from its current position
        when `options.language_detection_segments` > 1.
        """
        bundle, options = self.bundle, self.options
        if options.language_detection_segments > 1:
            for audio in batch:
                if audio.language is None:
                    audio.language, audio.language_probs = detect_language(
                        bundle, audio.samples[audio.seek * HOP_LENGTH:], options.language_detection_segments,
                        options.language_detection_threshold, audio.floor(bundle.n_mels))
                    audio.window_language = audio.language
        rows = [i for i, audio in enumerate(batch) if audio.language is None or options.multilingual]
        if not rows:
            return
        for i, (language, probs) in zip(rows, detect_languages(model_decoder.rows(rows), bundle.special)):
            audio = batch[i]
            if audio.language is None:
                audio.language, audio.language_probs = language, probs
                logger.info("detected language %s (p=%.2f)", language, probs[language])
            audio.window_language = language

    def _prompt(self, audio: AudioProgress) -> _WindowPrompt:
        """The window's prompt: previous text (or the prefix, or hotwords first), the start sequence, forced tokens."""
        options, special, texts = self.options, self.bundle.special, self.texts
        language = audio.window_language if options.multilingual else audio.language
        previous, prefix = audio.previous(self.prompt_room), []
        if texts.prefix and audio.prefix_pending:
            prefix = texts.prefix
        elif texts.hotwords:  # faster-whisper: hotwords go where the previous text goes, first
            room = self.prompt_room - len(texts.hotwords)
            previous = texts.hotwords + (previous[-room:] if room > 0 else [])
        timestamps = options.uses_timestamps
        prompt, sot_index = special.prompt(previous, language, options.task, timestamps, prefix)
        # Tokens the output is forced to start with (<|0.00|> and the prefix): the rules see them as generated.
        start = len(prompt) - (len(prefix) + timestamps if prefix else 0)
        return _WindowPrompt(previous, prompt, prompt[start:], sot_index - len(prompt),
                             whisper_filters(special, start, timestamps, suppress_tokens=self.suppress), language)

    def _segments(self, audio: AudioProgress, window: _WindowPrompt, result: WindowResult,
                  decoder: WhisperDecoderAdapter, row: int) -> None:
        """Adds the window's segments (and words: `decoder`'s window `row` aligns them) to `audio` and moves it
        past them."""
        options, special = self.options, self.bundle.special
        audio.prefix_pending = False
        if self.rules.needs_fallback(result):
            logger.warning("%sthe window at %.1f s failed the fallback checks at every temperature; its last "
                           "attempt (temperature %g) is kept", f"{audio.name}: " if audio.name else "",
                           audio.done_seconds, result.temperature)
        if no_speech_skip(result, self.rules):
            audio.consume([], audio.segment_size, result.temperature)
            return
        if window.forced:
            result = replace(result, tokens=window.forced + result.tokens)
        segments, advance = split_segments(result, special, audio.seek, audio.segment_size, self.decode_text)
        time_offset = audio.seek * HOP_LENGTH / SAMPLE_RATE
        if options.multilingual:
            for segment in segments:
                segment.language = audio.window_language
        if options.word_timestamps and segments:
            t = time.perf_counter()
            sot_index = len(window.tokens) + window.sot_from_end
            # openai-whisper's alignment pass: the start sequence, <|notimestamps|> (once), the text tokens.
            start_sequence = [t for t in window.tokens[sot_index:len(window.tokens) - len(window.forced)]
                              if t != special.no_timestamps]
            start_sequence.append(special.no_timestamps)
            add_word_timestamps(segments, self.bundle, decoder.rows([row]), start_sequence, audio.segment_size,
                                time_offset, audio.window_language or audio.language, audio.last_speech_timestamp)
            audio.stats.decode_seconds += time.perf_counter() - t
            segments, advance = after_words(audio, result, segments, advance, special.timestamp_begin)
        window_end = time_offset + audio.segment_size * HOP_LENGTH / SAMPLE_RATE
        audio.consume(kept_segments(segments, window_end), advance, result.temperature)
