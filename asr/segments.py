"""Cutting a window's tokens into timestamped segments (openai-whisper's `transcribe()` rules)."""

from __future__ import annotations

from typing import Callable

from asr.results import Segment
from asr.window import WindowResult

# Whisper's timestamps are 0.02 s apart: two mel frames per encoder position.
TIME_PRECISION = 0.02
INPUT_STRIDE = 2


def split_segments(result: WindowResult, timestamp_begin: int, eot: int, seek: int, time_offset: float,
                   segment_size: int, segment_duration: float,
                   decode_text: Callable[[list[int]], str]) -> tuple[list[Segment], int]:
    """openai-whisper's segmentation of one window's tokens at consecutive timestamp pairs.

    Returns:
        (the window's segments, how many mel frames to advance).
    """
    tokens = result.tokens
    is_timestamp = [t >= timestamp_begin for t in tokens]
    single_timestamp_ending = is_timestamp[-2:] == [False, True]
    consecutive = [i + 1 for i in range(len(tokens) - 1) if is_timestamp[i] and is_timestamp[i + 1]]

    # The model may place a timestamp past the audio in the last window: times stay inside the window's audio.
    window_end = time_offset + segment_duration

    def make(start: float, end: float, seg_tokens: list[int]) -> Segment:
        text = decode_text([t for t in seg_tokens if t < eot])
        start, end = min(start, window_end), min(end, window_end)
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
