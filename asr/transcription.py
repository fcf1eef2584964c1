"""Transcription of audio of any length, read top to bottom.

`transcribe_segments()` yields a recording's segments as its windows are decoded (faster-whisper's
`generate_segments`); `transcribe()` collects them into a `Transcript`; `transcribe_many()` transcribes several
recordings at once. Each goes through a `Transcriber`: the model, its assistant and the options, checked against
the model once per run. Two paths share one `WindowDecoder` (`asr.window_decoder`):

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
from collections.abc import Callable, Generator, Iterator, Sequence
from typing import TYPE_CHECKING

import numpy as np

from asr.options import TranscribeOptions
from asr.progress import AudioProgress, ChunkedRecording, ChunkProgress
from asr.results import Segment, Transcript
from asr.speech import Chunk, SpeechMap, merge_chunks
from asr.whisper.language import check_task, resolve_language
from asr.window_decoder import DecodedWindow, WindowAssistant, WindowDecoder, decode_in_batches
from audio import HOP_LENGTH, N_SAMPLES, SAMPLE_RATE, load_audio
from audio.vad import speech_regions

if TYPE_CHECKING:
    from asr.models.registry import WhisperBundle

__all__ = ["DecodedWindow", "Transcriber", "Transcription", "WindowAssistant", "transcribe", "transcribe_many",
           "transcribe_segments"]

logger = logging.getLogger(__name__)

Audio = str | bytes | np.ndarray
Progress = Callable[[float, float], None]


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
        for _ in decode_in_batches(self.decoder, [audio], 1):
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
        for _ in decode_in_batches(self.decoder, progresses, batch_size):
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
        for _ in decode_in_batches(self.decoder, [audio], 1):
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
        for _ in decode_in_batches(self.decoder, chunks, self.options.batch_size, on_finished=finished):
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


