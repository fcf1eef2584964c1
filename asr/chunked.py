"""Batched long-form transcription: a recording cut into speech chunks, decoded several at a time.

faster-whisper's `BatchedInferencePipeline` and WhisperX do this: Silero VAD finds the speech, the regions are
merged into chunks of at most 30 s cut at pauses (`asr.chunks.merge_chunks`), and the chunks are decoded as a
batch: one encoder call and one decoder loop for N chunks, with the assistant's ragged batched drafting when
there is one. Unlike the sequential algorithm, a chunk does not see the previous chunk's text, so the words can
differ from sequential decoding. Each chunk keeps Whisper's own rules: timestamp tokens (segments inside the
chunk; when the model stops at a timestamp before the chunk's end, leaving the rest for a next window, that
rest is decoded as one, after the chunk's earlier text, as the sequential algorithm would),
temperature fallback, the no-speech check and word timestamps, all in the recording's time.

A recording no longer than a window is one chunk, decoded whole as the sequential mode would (so a batch of
short clips gives the sequential words), unless the VAD finds no speech in it at all.

Chunks are made as places in the batch free up, and each one's features and encoder output live only while
it is decoded: memory does not grow with the length of the recording.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator

import numpy as np

from asr.chunks import Chunk, merge_chunks, shift_segments
from asr.longform import _Item, _WindowDecoder, decode_items
from asr.results import Segment, Transcript, TranscriptionStats
from audio import N_SAMPLES, SAMPLE_RATE
from audio.vad import speech_regions

logger = logging.getLogger(__name__)


@dataclass
class _File:
    """One recording's chunks and what came of them."""

    # Position among the audios given to `transcribe_many`.
    index: int
    samples: np.ndarray
    language: str | None
    start: float = field(default_factory=time.perf_counter)
    language_probs: dict[str, float] | None = None
    stats: TranscriptionStats = field(default_factory=TranscriptionStats)
    # Per chunk, in order: its segments in the recording's time (None until it is decoded).
    results: list[list[Segment] | None] = field(default_factory=list)
    finished_at: float | None = None

    def transcript(self) -> Transcript:
        segments = [segment for result in self.results for segment in result or []]
        for index, segment in enumerate(segments):
            segment.id = index
        self.stats.audio_seconds = len(self.samples) / SAMPLE_RATE
        self.stats.total_seconds = (self.finished_at or time.perf_counter()) - self.start
        text = "".join(segment.text for segment in segments)
        return Transcript(text, self.language or "en", segments, self.stats, self.language_probs)


class _ChunkItem(_Item):
    """A chunk as an item of the window loop: its own audio, and no text from other chunks.

    Text carried from one chunk to the next would make the chunks sequential again (faster-whisper and
    WhisperX decode each chunk alone too).
    """

    def __init__(self, file: _File, chunk_index: int, chunk: Chunk, options, initial_prompt: list[int]) -> None:
        super().__init__(file.index, file.samples[chunk.start:chunk.end], file.language, options, initial_prompt)
        self.file, self.chunk_index, self.chunk = file, chunk_index, chunk
        self.prefix_pending = chunk_index == 0  # the prefix starts the recording's first window only


def transcribe_chunked(decoder: _WindowDecoder, audios: list[np.ndarray], language: str | None,
                       initial_prompt: list[int],
                       progress: Callable[[float, float], None] | None = None) -> list[Transcript]:
    """Transcribes each audio as speech chunks of at most 30 s, `decoder.options.batch_size` chunks at a time.

    Chunks of all audios share the batches, in order. The language, when not given, is detected once per
    audio on its first chunk.

    Args:
        decoder: the window decoder (model, assistant, options).
        audios: 16 kHz mono samples, one array per recording.
        language: the language code, or None to detect it.
        initial_prompt: tokens of the initial prompt, given to every chunk.
        progress: for a single audio, called with (seconds done, seconds in all) after each batch.

    Returns:
        One transcript per audio, in order.
    """
    options = decoder.options
    files = [_File(index, samples, language) for index, samples in enumerate(audios)]
    done = [0.0]

    def finished(item: _Item) -> None:
        assert isinstance(item, _ChunkItem)
        file = item.file
        shift_segments(item.segments, item.chunk)
        file.results[item.chunk_index] = item.segments
        item.stats.audio_seconds = item.stats.total_seconds = 0.0  # the file's own are set at its end
        file.stats.add(item.stats)
        done[0] = max(done[0], item.chunk.end / SAMPLE_RATE)
        if all(result is not None for result in file.results):
            file.finished_at = time.perf_counter()

    def report(_: list[_Item]) -> None:
        if progress is not None and len(files) == 1:
            progress(done[0], len(files[0].samples) / SAMPLE_RATE)

    items = _chunk_items(files, decoder, options, initial_prompt)
    decode_items(decoder, items, options.batch_size, after_batch=report, on_finished=finished)
    return [file.transcript() for file in files]


def _chunk_items(files: list[_File], decoder: _WindowDecoder, options, initial_prompt: list[int]) -> Iterator[_Item]:
    """Each file's chunks as items, made only when the batch has room for them."""
    for file in files:
        start = time.perf_counter()
        regions = speech_regions(file.samples, options.chunk_vad)
        chunks = merge_chunks(regions, N_SAMPLES)
        if chunks and len(file.samples) <= N_SAMPLES:
            # A clip that fits one window is decoded whole, as the sequential mode decodes it (the same words);
            # the VAD only says whether it holds speech at all.
            chunks = [Chunk(0, len(file.samples))]
        file.stats.vad_seconds += time.perf_counter() - start
        file.results = [None] * len(chunks)
        logger.info("VAD: %d speech chunk(s), %.1f s of %.1f s", len(chunks),
                    sum(c.end - c.start for c in chunks) / SAMPLE_RATE, len(file.samples) / SAMPLE_RATE)
        if not chunks:
            file.finished_at = time.perf_counter()
            continue
        if file.language is None:
            first = chunks[0]
            start = time.perf_counter()
            several = options.language_detection_segments > 1  # then the windows after the first chunk too
            file.language, file.language_probs = decoder.detect_language(
                file.samples[first.start:None if several else first.end])
            file.stats.encode_seconds += time.perf_counter() - start
        for index, chunk in enumerate(chunks):
            yield _ChunkItem(file, index, chunk, options, initial_prompt)
