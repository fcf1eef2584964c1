"""Segments as they are decoded (faster-whisper style): `transcribe_segments` returns a `Transcription` whose
iteration yields each segment once its window is done, and whose `result()` gives the `Transcript`."""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterator

import numpy as np

from asr.items import sequential_item
from asr.longform import DecodedWindow, WindowAssistant, _WindowDecoder, prepare
from asr.options import TranscribeOptions
from asr.results import Segment, Transcript
from audio import load_audio


class Transcription:
    """A transcription under way: iterate for its segments (each once), then `result()` for the transcript.

    `result()` decodes whatever is left first, so it can also be called without iterating.
    """

    def __init__(self) -> None:
        self._segments: Generator[Segment, None, Transcript] | None = None
        self._transcript: Transcript | None = None
        # Known once the first window is decoded (given, or detected on it); None before.
        self.language: str | None = None
        self.language_probs: dict[str, float] | None = None

    def __iter__(self) -> Iterator[Segment]:
        assert self._segments is not None
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
        """The whole transcript (as `asr.longform.transcribe` gives it), decoding what is left."""
        for _ in self:
            pass
        assert self._transcript is not None
        return self._transcript


def transcribe_segments(
    bundle,
    audio: str | np.ndarray,
    options: TranscribeOptions | None = None,
    assistant: WindowAssistant | None = None,
    progress: Callable[[float, float], None] | None = None,
    window_observer: Callable[[DecodedWindow], None] | None = None,
) -> Transcription:
    """`asr.longform.transcribe`, segment by segment: each window's segments come as soon as it is decoded.

    The options are checked and the audio read now; decoding happens as the segments are taken. With
    `options.batch_size` (batched chunks) the segments come all at the end.

    Raises:
        audio.AudioError: the audio cannot be read.
        ValueError: options the model cannot honour.
    """
    options = options or TranscribeOptions()
    language, initial, decoder = prepare(bundle, options, assistant, window_observer)
    transcription = Transcription()
    transcription._segments = _segments(transcription, decoder, load_audio(audio), language, initial, progress)
    return transcription


def _segments(transcription: Transcription, decoder: _WindowDecoder, samples: np.ndarray, language: str | None,
              initial: list[int], progress: Callable[[float, float], None] | None) -> Generator[Segment, None, Transcript]:
    if decoder.options.batch_size is not None:
        from asr.chunked import transcribe_chunked

        transcript = transcribe_chunked(decoder, [samples], language, initial, progress)[0]
        transcription.language, transcription.language_probs = transcript.language, transcript.language_probs
        yield from transcript.segments
        return transcript
    item = sequential_item(0, samples, language, decoder.options, initial)
    while item.next_window():
        decoder.decode([item])
        transcription.language, transcription.language_probs = item.language, item.language_probs
        if progress is not None:
            progress(item.done_seconds, item.stats.audio_seconds)
        yield from item.restore_new()
    return item.transcript()
