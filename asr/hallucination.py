"""What word times decide in openai-whisper's loop: where the next window starts, and with
`hallucination_silence_threshold` the silence skipped around segments that look hallucinated (improbable, too
short or too long words) instead of keeping them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from asr.results import Segment, Word
from asr.whisper.window import ends_on_single_timestamp
from audio.constants import FRAMES_PER_SECOND, HOP_LENGTH, N_FRAMES, SAMPLE_RATE

if TYPE_CHECKING:
    from asr.options import TranscribeOptions
    from asr.whisper.window import WindowResult

PUNCTUATION = "\"'“¿([{-\"'.。,，!！?？:：”)]}、"


class WindowPlace(Protocol):
    """Where a window is in its audio (`asr.progress.AudioProgress` is one)."""

    options: TranscribeOptions
    seek: int  # the window's first mel frame
    segment_size: int  # the window's length in mel frames
    content_frames: int  # the audio's length in mel frames
    last_speech_timestamp: float  # the end of the last word kept so far, seconds
    resumes_at_last_word: bool  # whether the next window starts at the last word's end (not a batched chunk)


def word_anomaly_score(word: Word) -> float:
    duration = word.end - word.start
    score = 0.0
    if word.probability < 0.15:
        score += 1.0
    if duration < 0.133:
        score += (0.133 - duration) * 15
    if duration > 2.0:
        score += duration - 2.0
    return score


def is_segment_anomaly(segment: Segment | None) -> bool:
    if segment is None or not segment.words:
        return False
    words = [w for w in segment.words if w.word not in PUNCTUATION][:8]
    score = sum(word_anomaly_score(w) for w in words)
    return score >= 3 or score + 0.01 >= len(words)


def _next_words_segment(segments: list[Segment]) -> Segment | None:
    return next((s for s in segments if s.words), None)


def last_word_end(segments: list[Segment]) -> float | None:
    return next((w.end for s in reversed(segments) for w in reversed(s.words or [])), None)


def after_words(item: WindowPlace, result: WindowResult, segments: list[Segment], advance: int,
                timestamp_begin: int) -> tuple[list[Segment], int]:
    """What word times decide for a window, as openai-whisper's loop has it: the next window starts at the last
    word's end (not the last timestamp) unless the window ended on a lone timestamp; the hallucination checks
    when asked for; the end of the last word kept, for the next window's alignment.

    Returns:
        (the segments to keep, the frames to advance by).
    """
    seek = item.seek
    if item.resumes_at_last_word and not ends_on_single_timestamp(result.tokens, timestamp_begin):
        end = last_word_end(segments)
        if end is not None and end > seek * HOP_LENGTH / SAMPLE_RATE:
            advance = round(end * FRAMES_PER_SECOND) - seek
    if item.options.hallucination_silence_threshold is not None:
        return skip_hallucinations(item, result, segments, advance, timestamp_begin)  # sets the last speech too
    end = last_word_end(segments)
    if end is not None:
        item.last_speech_timestamp = end
    return segments, advance


def skip_hallucinations(item: WindowPlace, result: WindowResult, segments: list[Segment], advance: int,
                        timestamp_begin: int) -> tuple[list[Segment], int]:
    """openai-whisper's checks after word alignment, for one window.

    Args:
        item: the audio's progress (its seek, window size, last speech time, audio length).
        result: the window's decoding (its tokens say whether it ended on a single timestamp).
        segments: the window's segments, with words.
        advance: the mel frames the window would advance by.
        timestamp_begin: id of <|0.00|>.

    Returns:
        (the segments to keep, the frames to advance by).
    """
    threshold = item.options.hallucination_silence_threshold
    seek, segment_size = item.seek, item.segment_size
    time_offset = seek * HOP_LENGTH / SAMPLE_RATE
    window_end_time = (seek + N_FRAMES) * HOP_LENGTH / SAMPLE_RATE
    segment_duration = segment_size * HOP_LENGTH / SAMPLE_RATE
    content_duration = item.content_frames * HOP_LENGTH / SAMPLE_RATE
    tokens = result.tokens
    single_timestamp_ending = ends_on_single_timestamp(tokens, timestamp_begin)
    new_seek = seek + advance
    if not single_timestamp_ending:
        word_end = last_word_end(segments)
        if word_end is not None and word_end > time_offset:
            remaining = window_end_time - word_end
            new_seek = round(word_end * FRAMES_PER_SECOND) if remaining > threshold else seek + segment_size

    # A first segment that may be hallucinated: skip the silence before it, and decode from there again.
    first = _next_words_segment(segments)
    if first is not None and is_segment_anomaly(first):
        gap = first.start - time_offset
        if gap > threshold:
            return [], round(gap * FRAMES_PER_SECOND)

    # A possible hallucination surrounded by silence or more hallucinations: drop it and what follows.
    hal_last_end = item.last_speech_timestamp
    for index, segment in enumerate(segments):
        if not segment.words:
            continue
        if is_segment_anomaly(segment):
            following = _next_words_segment(segments[index + 1:])
            hal_next_start = following.words[0].start if following is not None else time_offset + segment_duration
            silence_before = (segment.start - hal_last_end > threshold or segment.start < threshold
                              or segment.start - time_offset < 2.0)
            silence_after = (hal_next_start - segment.end > threshold or is_segment_anomaly(following)
                             or window_end_time - segment.end < 2.0)
            if silence_before and silence_after:
                new_seek = round(max(time_offset + 1, segment.start) * FRAMES_PER_SECOND)
                if content_duration - segment.end < threshold:
                    new_seek = item.content_frames
                segments = segments[:index]
                break
        hal_last_end = segment.end

    word_end = last_word_end(segments)
    if word_end is not None:
        item.last_speech_timestamp = word_end
    return segments, new_seek - seek
