"""One window's rules (`asr.whisper.window`): the fallback checks, the silence skip, the compression ratio, and the cut of
a window's tokens into segments (openai-whisper's rules), on hand-made tokens."""

from __future__ import annotations

import zlib
from types import SimpleNamespace

import pytest

from asr.whisper.window import (
    FallbackRules,
    WindowResult,
    compression_ratio,
    kept_segments,
    no_speech_skip,
    split_segments,
)

OPENAI = FallbackRules((0.0, 0.2, 0.4, 0.6, 0.8, 1.0), compression_ratio_threshold=2.4, logprob_threshold=-1.0,
                       no_speech_threshold=0.6)
NEVER = FallbackRules((0.0,), None, None, None)


def window(tokens: list[int] = (), *, logprob: float = -0.5, ratio: float = 1.5, no_speech: float = 0.1,
           temperature: float = 0.0) -> WindowResult:
    return WindowResult(list(tokens), temperature, logprob, ratio, no_speech)


@pytest.mark.parametrize("result, fallback", [
    (window(), False),
    (window(ratio=2.5), True),  # too repetitive
    (window(ratio=2.4), False),  # the thresholds are strict
    (window(logprob=-1.5), True),  # too unsure
    (window(logprob=-1.0), False),
    (window(logprob=-1.5, no_speech=0.7), False),  # unsure, and likely silence: accepted as it is
    (window(logprob=-1.5, ratio=3.0, no_speech=0.7), False),  # silence wins over repetition too
    (window(ratio=3.0, no_speech=0.9), True),  # sure of its text: not silence, so repetition counts
    (window(logprob=-1.5, no_speech=0.6), True),
], ids=["good", "repetitive", "ratio-at-threshold", "unsure", "logprob-at-threshold", "silence",
        "silent-and-repetitive", "sure-and-repetitive", "no-speech-at-threshold"])
def test_needs_fallback(result: WindowResult, fallback: bool) -> None:
    assert OPENAI.needs_fallback(result) is fallback


def test_without_thresholds_nothing_falls_back() -> None:
    assert not NEVER.needs_fallback(window(logprob=-50.0, ratio=40.0, no_speech=1.0))
    only_ratio = FallbackRules((0.0, 1.0), 2.4, None, 0.6)
    assert only_ratio.needs_fallback(window(ratio=3.0, logprob=-50.0, no_speech=1.0))  # no logprob: never silence
    assert not only_ratio.needs_fallback(window(logprob=-50.0))


@pytest.mark.parametrize("result, skip", [
    (window(no_speech=0.7, logprob=-1.5), True),
    (window(no_speech=0.7, logprob=-1.0), True),  # not above the logprob threshold
    (window(no_speech=0.7, logprob=-0.5), False),  # sure of its text: kept
    (window(no_speech=0.6, logprob=-1.5), False),
    (window(no_speech=0.1, logprob=-5.0), False),
])
def test_no_speech_skip(result: WindowResult, skip: bool) -> None:
    assert no_speech_skip(result, OPENAI) is skip


def test_no_speech_skip_without_thresholds() -> None:
    assert not no_speech_skip(window(no_speech=1.0, logprob=-9.0), NEVER)
    assert no_speech_skip(window(no_speech=0.7, logprob=-0.1), FallbackRules((0.0,), None, None, 0.6))


def test_compression_ratio() -> None:
    assert compression_ratio("") == 0.0
    text = " The sun was shining and the children were playing in the park."
    assert compression_ratio(text) == len(text.encode()) / len(zlib.compress(text.encode()))
    assert compression_ratio(text) < 2.4
    assert compression_ratio(" thank you" * 40) > 2.4  # Whisper's typical loop
    assert compression_ratio("é" * 10) == 20 / len(zlib.compress(("é" * 10).encode()))  # bytes, not characters


# --- segments -----------------------------------------------------------------------------------------------------

TS, EOT = 100, 50  # timestamp_begin and end-of-text of a toy vocabulary; text tokens are below EOT
WINDOW_FRAMES = 3000  # a full window: 30 s in frames of 10 ms


def text_of(tokens: list[int]) -> str:
    return "".join(" " if t == 7 else f" w{t}" for t in tokens)  # token 7 is a blank


def split(tokens: list[int], *, seek: int = 0, segment_size: int = WINDOW_FRAMES, temperature: float = 0.0):
    """`split_segments` for the toy vocabulary (the one call of it in this file): (segments, advance)."""
    result = window(tokens, temperature=temperature)
    return split_segments(result, SimpleNamespace(timestamp_begin=TS, eot=EOT), seek, segment_size, text_of)


def spans(segments) -> list[tuple[float, float, str, list[int]]]:
    return [(s.start, s.end, s.text, s.tokens) for s in segments]


def test_consecutive_timestamps_cut_segments_and_a_single_last_one_closes_the_window() -> None:
    # <0.00> a b <0.10><0.10> c <0.24>: two segments; the window is used up, so the next starts after it.
    segments, advance = split([100, 1, 2, 105, 105, 3, 112], seek=3000)
    assert spans(segments) == [(30.0, 30.1, " w1 w2", [100, 1, 2, 105]), (30.1, 30.24, " w3", [105, 3, 112])]
    assert advance == WINDOW_FRAMES
    first = segments[0]
    assert (first.seek, first.temperature, first.avg_logprob, first.compression_ratio, first.no_speech_prob) == \
        (3000, 0.0, -0.5, 1.5, 0.1)


def test_a_window_ending_in_a_pair_resumes_at_the_last_complete_segment() -> None:
    # <0.00> a <0.10><0.10> b <0.20><0.20>: the speech went on past the window; resume at 0.20 s (20 frames).
    segments, advance = split([100, 1, 105, 105, 2, 110, 110])
    assert spans(segments) == [(0.0, 0.1, " w1", [100, 1, 105]), (0.1, 0.2, " w2", [105, 2, 110])]
    assert advance == 20


def test_a_window_ending_in_text_drops_the_unfinished_segment() -> None:
    segments, advance = split([100, 1, 105, 105, 2, 3])
    assert spans(segments) == [(0.0, 0.1, " w1", [100, 1, 105])]
    assert advance == 10


def test_without_a_pair_the_window_is_one_segment_up_to_its_last_timestamp() -> None:
    segments, advance = split([100, 1, 2, 150], seek=500)
    assert spans(segments) == [(5.0, 6.0, " w1 w2", [100, 1, 2, 150])]
    assert advance == WINDOW_FRAMES


def test_without_timestamps_the_segment_spans_the_window() -> None:
    segments, advance = split([1, 2, 3], seek=1500, segment_size=1234)
    assert spans(segments) == [(15.0, 27.34, " w1 w2 w3", [1, 2, 3])]
    assert advance == 1234
    assert spans(split([100, 1, 2])[0]) == [(0.0, 30.0, " w1 w2", [100, 1, 2])]  # only <0.00>: the whole window


def test_times_past_the_audio_stop_at_the_windows_end_and_their_words_stay() -> None:
    # The last window holds 2 s of audio, but the model put its timestamps at 3 s and 4 s.
    segments, advance = split([100, 1, 250, 250, 2, 300], seek=6000, segment_size=200)
    assert [(s.start, s.end) for s in segments] == [(60.0, 63.0), (63.0, 64.0)]  # openai-whisper's times
    assert advance == 200
    kept = kept_segments(segments, window_end=62.0)
    assert [(s.start, s.end, s.text) for s in kept] == [(60.0, 62.0, " w1"), (62.0, 62.0, " w2")]


def test_segments_without_length_or_text_are_dropped_after_alignment() -> None:
    segments, _ = split([100, 105, 105, 7, 110, 110, 1, 115])
    assert len(segments) == 4  # word alignment sees them all, as openai-whisper's does
    assert spans(kept_segments(segments, 30.0)) == [(0.2, 0.3, " w1", [110, 1, 115])]
    assert kept_segments(split([100])[0], 30.0) == [] and kept_segments(split([])[0], 30.0) == []


def test_the_windows_temperature_goes_with_its_segments() -> None:
    segments, _ = split([100, 1, 105], temperature=0.4)
    assert [s.temperature for s in segments] == [0.4]
