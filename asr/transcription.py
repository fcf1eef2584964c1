"""Transcription of audio of any length, read top to bottom.

`transcribe_segments()` yields a recording's segments as its windows are decoded (faster-whisper's
`generate_segments`); `transcribe()` collects them into a `Transcript`; `transcribe_many()` transcribes several
recordings at once. Each goes through a `Transcriber`: the model, its assistant and the options, checked against
the model once per run. Two paths share one `WindowDecoder`:

- sequential (openai-whisper's algorithm): each 30 s window is encoded once and decoded (with the assistant's
  drafts when there is one) into timestamped segments; the next window starts at the end of the last complete
  segment. Windows of several recordings are decoded as one batch, and a recording that finishes makes room for
  the next (continuous batching at window granularity). `options.vad` keeps only the speech Silero VAD finds.
- batched (`options.batch_size`; faster-whisper's `BatchedInferencePipeline`, WhisperX): the speech is cut into
  chunks of at most 30 s at pauses (`asr.speech.merge_chunks`) and `batch_size` chunks are decoded at a time,
  each without the previous chunk's text, so the words can differ from the sequential path's. A chunk keeps
  Whisper's own rules (timestamps, fallback, the no-speech check, word times) in the recording's time; a
  recording no longer than a window is one chunk, decoded as the sequential path would. Chunks are made as
  places in the batch free up: memory does not grow with the recording's length.

Each recording's state is one `AudioProgress` record (a `ChunkProgress` per chunk on the batched path).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Protocol

import numpy as np
import torch

from asr.hallucination import after_words
from asr.models.precision import pack_for_rows
from asr.options import TranscribeOptions, check_for_model, prompt_room, prompt_texts
from asr.progress import AudioProgress, ChunkedRecording, ChunkProgress
from asr.results import Segment, Transcript
from asr.speech import Chunk, SpeechMap, merge_chunks
from asr.whisper.alignment import add_word_timestamps
from asr.whisper.decoder import WhisperDecoderAdapter
from asr.whisper.language import check_task, detect_language, detect_languages, resolve_language
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
from audio import HOP_LENGTH, N_SAMPLES, SAMPLE_RATE, load_audio, log_mel
from audio.vad import speech_regions
from decoding import DraftSource, LogitsFilter

if TYPE_CHECKING:
    from asr.models.registry import WhisperBundle

logger = logging.getLogger(__name__)

Audio = str | bytes | np.ndarray
Progress = Callable[[float, float], None]


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


# 1. The public functions: each builds a `Transcriber` (the checks) and runs it.
def transcribe_segments(bundle: WhisperBundle, audio: Audio, options: TranscribeOptions | None = None,
                        assistant: WindowAssistant | None = None, progress: Progress | None = None,
                        window_observer: Callable[[DecodedWindow], None] | None = None) -> Transcription:
    """Transcribes (or translates) a file, its bytes, or 16 kHz mono float32 samples, segment by segment.

    The options are checked and the audio read now; decoding happens as the segments are taken: each window's
    segments come as soon as it is decoded (with `options.batch_size`, all at the end).

    Args:
        bundle: a loaded model (`asr.models.registry.load_model`).
        audio: a path, a file's bytes, or mono samples at 16 kHz. For one channel of a stereo recording (each
            side of a call), pass `audio.load_audio(path, channel=0)` (left) or `channel=1` (right).
        options: what to produce and how (default `TranscribeOptions()`).
        assistant: drafts tokens for the model to check; None for plain decoding. The words are the model's either way.
        progress: called with (seconds done, seconds in all) after each window.
        window_observer: sees every decoded window (its encoder output, prompt and tokens).

    Returns:
        A `Transcription`: iterate it for the segments, `result()` for the `Transcript`.

    Raises:
        audio.AudioError: the audio cannot be read.
        ValueError: options the model cannot honour (an unknown language, translation with an English-only model),
            or an assistant with beam search (`options.beam_size` > 1 decodes with the model alone).
    """
    return Transcriber(bundle, options or TranscribeOptions(), assistant, window_observer).segments(audio, progress)


def transcribe(bundle: WhisperBundle, audio: Audio, options: TranscribeOptions = TranscribeOptions(),
               assistant: WindowAssistant | None = None, progress: Progress | None = None) -> Transcript:
    """`transcribe_segments`, collected: the text, language, segments and statistics of the whole audio."""
    return transcribe_segments(bundle, audio, options, assistant, progress).result()


def transcribe_many(bundle: WhisperBundle, audios: Sequence[Audio], options: TranscribeOptions = TranscribeOptions(),
                    assistant: WindowAssistant | None = None, batch_size: int = 8, progress: Progress | None = None,
                    window_observer: Callable[[DecodedWindow], None] | None = None) -> list[Transcript]:
    """Transcribes several audios, decoding up to `batch_size` windows (one per audio) at a time.

    Each transcript holds the words `transcribe` gives for that audio alone (greedy decoding; batched and
    single kernels may differ in the last bits of a float). Statistics of shared passes are split evenly.
    With `options.batch_size` set, the audios' speech chunks are decoded that many at a time instead, all
    audios' chunks sharing the batches; `batch_size` is then unused.

    Raises:
        audio.AudioError: an audio cannot be read (decode files first to handle them one by one).
        ValueError: as for `transcribe_segments`, or batch_size < 1.
    """
    return Transcriber(bundle, options, assistant, window_observer).transcribe_many(audios, batch_size, progress)


class Transcription:
    """A transcription under way: iterate for its segments (each once), then `result()` for the transcript.

    `result()` decodes whatever is left first, so it can also be called without iterating.
    """

    def __init__(self, segments: Callable[[Transcription], Generator[Segment, None, Transcript]]) -> None:
        # Known once the first window is decoded (given, or detected on it); None before.
        self.language: str | None = None
        self.language_probs: dict[str, float] | None = None
        self._segments = segments(self)
        self._transcript: Transcript | None = None

    def __iter__(self) -> Iterator[Segment]:
        while self._transcript is None:
            try:
                yield next(self._segments)
            except StopIteration as stop:
                self._transcript = stop.value

    @property
    def segments(self) -> Iterator[Segment]:
        """The segments not yet taken, as they are decoded."""
        return iter(self)

    def result(self) -> Transcript:
        """The whole transcript (as `transcribe` gives it), decoding what is left."""
        for _ in self:
            pass
        assert self._transcript is not None
        return self._transcript


# 2. One run: the checks once, then the sequential or the batched path over one window decoder.
class Transcriber:
    """A model, its assistant and the options, checked against the model once; transcribes any number of audios.

    Raises:
        ValueError: options the model cannot honour, or an assistant with beam search.
    """

    def __init__(self, bundle: WhisperBundle, options: TranscribeOptions = TranscribeOptions(),
                 assistant: WindowAssistant | None = None,
                 window_observer: Callable[[DecodedWindow], None] | None = None) -> None:
        self.language = resolve_language(options.language, bundle)
        check_task(options.task, bundle)
        self.options = options
        self.decoder = WindowDecoder(bundle, options, assistant, window_observer)

    def segments(self, audio: Audio, progress: Progress | None = None) -> Transcription:
        """`transcribe_segments` of one audio (read now, decoded as the segments are taken)."""
        samples = load_audio(audio)
        name = audio if isinstance(audio, str) else None
        if self.options.batch_size is not None:
            return Transcription(lambda transcription: self._batched_segments(transcription, samples, progress))
        return Transcription(lambda transcription: self._sequential_segments(transcription, samples, name, progress))

    def leading_windows(self, samples: np.ndarray, min_rest: float) -> Transcript:
        """The transcript of `samples`' windows up to where less than `min_rest` seconds are left (a live buffer:
        a short rest after the last complete segment comes with the next update, not with an encoder pass now)."""
        audio = self._audio_progress(0, samples)
        for _ in _decode_in_batches(self.decoder, [audio], 1):
            if (audio.content_frames - audio.seek) * HOP_LENGTH / SAMPLE_RATE < min_rest:
                break
        return audio.transcript()

    def transcribe_many(self, audios: Sequence[Audio], batch_size: int = 8,
                        progress: Progress | None = None) -> list[Transcript]:
        """`transcribe_many` with this run's model, assistant and options."""
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        samples = [load_audio(audio) for audio in audios]
        if self.options.batch_size is not None:
            return self._batched(samples, progress)
        progresses = [self._audio_progress(index, audio) for index, audio in enumerate(samples)]
        for _ in _decode_in_batches(self.decoder, progresses, batch_size):
            if progress is not None and len(progresses) == 1:
                progress(progresses[0].done_seconds, progresses[0].stats.audio_seconds)
        return [audio.transcript() for audio in progresses]

    def _audio_progress(self, index: int, samples: np.ndarray, name: str | None = None) -> AudioProgress:
        """An audio on the sequential path: all of it, or with `options.vad` its speech only."""
        options, initial = self.options, self.decoder.texts.initial
        if options.vad is None:
            return AudioProgress(index, samples, self.language, options, initial, name=name)
        start = time.perf_counter()
        speech_map = SpeechMap(speech_regions(samples, options.vad))
        audio = AudioProgress(index, speech_map.speech(samples), self.language, options, initial, speech_map, name)
        audio.start = start
        audio.stats.audio_seconds = len(samples) / SAMPLE_RATE
        audio.stats.vad_seconds = time.perf_counter() - start
        logger.info("VAD: %.1f s of speech in %.1f s", len(audio.samples) / SAMPLE_RATE, audio.stats.audio_seconds)
        return audio

    def _sequential_segments(self, transcription: Transcription, samples: np.ndarray, name: str | None,
                             progress: Progress | None) -> Generator[Segment, None, Transcript]:
        audio = self._audio_progress(0, samples, name)
        if progress is not None:  # a bar at once, before the first window's encoder pass
            progress(0.0, audio.stats.audio_seconds)
        for _ in _decode_in_batches(self.decoder, [audio], 1):
            transcription.language, transcription.language_probs = audio.language, audio.language_probs
            if progress is not None:
                progress(audio.done_seconds, audio.stats.audio_seconds)
            yield from audio.take_new_segments()
        return audio.transcript()

    def _batched_segments(self, transcription: Transcription, samples: np.ndarray,
                          progress: Progress | None) -> Generator[Segment, None, Transcript]:
        transcript = self._batched([samples], progress)[0]
        transcription.language, transcription.language_probs = transcript.language, transcript.language_probs
        yield from transcript.segments
        return transcript

    def _batched(self, audios: list[np.ndarray], progress: Progress | None) -> list[Transcript]:
        """The batched path: each audio's speech chunks, `options.batch_size` at a time, all audios' chunks sharing
        the batches in order. The language, when not given, is detected once per audio on its first chunk."""
        recordings = [ChunkedRecording(index, samples, self.language) for index, samples in enumerate(audios)]
        done = 0.0

        def finished(chunk: AudioProgress) -> None:
            nonlocal done
            assert isinstance(chunk, ChunkProgress)
            chunk.recording.add(chunk)
            done = max(done, chunk.chunk.end / SAMPLE_RATE)

        chunks = self._chunks(recordings)
        if progress is not None and len(recordings) == 1:
            progress(0.0, len(audios[0]) / SAMPLE_RATE)
        for _ in _decode_in_batches(self.decoder, chunks, self.options.batch_size, on_finished=finished):
            if progress is not None and len(recordings) == 1:
                progress(done, len(audios[0]) / SAMPLE_RATE)
        return [recording.transcript() for recording in recordings]

    def _chunks(self, recordings: list[ChunkedRecording]) -> Iterator[ChunkProgress]:
        """Each recording's chunks, made only when the batch has room for them."""
        options = self.options
        for recording in recordings:
            start = time.perf_counter()
            samples = recording.samples
            chunks = merge_chunks(speech_regions(samples, options.chunk_vad), N_SAMPLES)
            if chunks and len(samples) <= N_SAMPLES:
                # A clip that fits one window is decoded whole, as the sequential path decodes it (the same
                # words); the VAD only says whether it holds speech at all.
                chunks = [Chunk(0, len(samples))]
            recording.stats.vad_seconds += time.perf_counter() - start
            recording.results = [None] * len(chunks)
            logger.info("VAD: %d speech chunk(s), %.1f s of %.1f s", len(chunks),
                        sum(c.end - c.start for c in chunks) / SAMPLE_RATE, len(samples) / SAMPLE_RATE)
            if not chunks:
                recording.finished_at = time.perf_counter()
                continue
            if recording.language is None:
                start = time.perf_counter()
                several = options.language_detection_segments > 1  # then the windows after the first chunk too
                recording.language, recording.language_probs = self.decoder.detect_language(
                    samples[chunks[0].start:None if several else chunks[0].end])
                recording.stats.encode_seconds += time.perf_counter() - start
            for index, chunk in enumerate(chunks):
                yield ChunkProgress(recording, index, chunk, options, self.decoder.texts.initial)


def _decode_in_batches(decoder: WindowDecoder, waiting: Iterable[AudioProgress], batch_size: int,
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


# 3. One batch of windows: encoder, language, prompts, decoding with fallback, segments, words.
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
