"""Speech regions into what Whisper decodes: chunks of at most 30 s, or one stretch of speech only.

- `merge_chunks`: consecutive regions joined into chunks no longer than a window, cut at the pauses between
  regions (faster-whisper's `merge_segments`, WhisperX's `merge_chunks`). A chunk keeps the short pauses
  inside it, so its times are its start plus the model's.
- `SpeechMap`: the regions laid end to end (faster-whisper's `vad_filter`), and the way back from a time in
  that speech-only audio to the same instant of the recording (its `SpeechTimestampsMap`).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

import numpy as np

from asr.results import Segment
from audio import HOP_LENGTH, SAMPLE_RATE
from audio.vad import SpeechRegion


@dataclass(frozen=True)
class Chunk:
    """Samples [start, end) of the recording, decoded as one window."""

    start: int
    end: int

    @property
    def offset(self) -> float:
        """Start time in the recording, seconds."""
        return self.start / SAMPLE_RATE


def merge_chunks(regions: list[SpeechRegion], max_samples: int) -> list[Chunk]:
    """Joins consecutive regions while the span from the first one's start to the last one's end fits.

    Args:
        regions: in order, not overlapping; each at most `max_samples` long (a longer one is cut to fit).
        max_samples: the longest chunk (a window: 30 s).

    Returns:
        Chunks in order; no chunk crosses a region, and every region is in exactly one chunk.
    """
    chunks: list[Chunk] = []
    start = end = None
    for region in regions:
        if start is not None and region.end - start > max_samples:
            chunks.append(Chunk(start, end))
            start = None
        if start is None:
            start = region.start
        end = region.end
        while end - start > max_samples:  # a region longer than a window (the VAD's cap was larger)
            chunks.append(Chunk(start, start + max_samples))
            start += max_samples
    if start is not None:
        chunks.append(Chunk(start, end))
    return chunks


def shift_segments(segments: list[Segment], chunk: Chunk) -> None:
    """Moves a chunk's segments (and words) from the chunk's time line to the recording's."""
    offset = chunk.offset
    frames = chunk.start // HOP_LENGTH
    for segment in segments:
        segment.seek += frames
        segment.start = round(segment.start + offset, 3)
        segment.end = round(segment.end + offset, 3)
        for word in segment.words or []:
            word.start = round(word.start + offset, 3)
            word.end = round(word.end + offset, 3)


class SpeechMap:
    """The speech regions of a recording laid end to end, and times in them mapped back to the recording."""

    def __init__(self, regions: list[SpeechRegion]) -> None:
        self.regions = regions
        # Where each region starts in the speech-only audio, in samples; then the total length.
        self.starts = np.cumsum([0] + [r.end - r.start for r in regions]).tolist()

    def speech(self, samples: np.ndarray) -> np.ndarray:
        """The speech-only audio: the regions' samples, one after the other."""
        if not self.regions:
            return np.zeros(0, dtype=np.float32)
        return np.concatenate([samples[r.start:r.end] for r in self.regions])

    def original_time(self, seconds: float, is_end: bool = False) -> float:
        """The recording's time of an instant of the speech-only audio.

        An end that falls exactly on the join of two regions belongs to the earlier one (the speech before
        the join), a start to the later one.
        """
        if not self.regions:
            return seconds
        index = self._region(seconds, is_end)
        return (self.regions[index].start + seconds * SAMPLE_RATE - self.starts[index]) / SAMPLE_RATE

    def restore(self, segments: list[Segment]) -> None:
        """Moves segments (and words) from the speech-only time line to the recording's.

        A segment that crosses the join of two regions would span the silence between them (Whisper's segment
        times are coarse near a join): it is kept to the region that holds most of it. Words are mapped one
        by one.
        """
        for segment in segments:
            segment.seek = round(self.original_time(segment.seek * HOP_LENGTH / SAMPLE_RATE) * SAMPLE_RATE) \
                // HOP_LENGTH
            first, last = self._region(segment.start), self._region(segment.end, is_end=True)
            start, end = self.original_time(segment.start), self.original_time(segment.end, is_end=True)
            if first < last:
                span = (segment.start * SAMPLE_RATE, segment.end * SAMPLE_RATE)
                overlaps = [min(span[1], self.starts[k + 1]) - max(span[0], self.starts[k])
                            for k in range(first, last + 1)]
                kept = first + int(np.argmax(overlaps))
                if kept > first:
                    start = self.regions[kept].start / SAMPLE_RATE
                if kept < last:
                    end = self.regions[kept].end / SAMPLE_RATE
            segment.start, segment.end = round(start, 3), round(end, 3)
            for word in segment.words or []:
                word.start = round(self.original_time(word.start), 3)
                word.end = round(self.original_time(word.end, is_end=True), 3)

    def _region(self, seconds: float, is_end: bool = False) -> int:
        """Index of the region an instant of the speech-only audio falls in (see `original_time`)."""
        find = bisect.bisect_left if is_end else bisect.bisect_right
        return min(max(find(self.starts, seconds * SAMPLE_RATE) - 1, 0), max(len(self.regions) - 1, 0))
