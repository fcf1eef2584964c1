"""Subtitle layout from word timestamps (openai-whisper's --max_line_width and friends), on hand-made transcripts."""

from __future__ import annotations

import io

import pytest

from asr.results import Segment, Transcript, TranscriptionStats, Word
from asr.writers import (
    SubtitleOptions,
    subtitle_cues,
    write_outputs,
    write_srt,
    write_vtt,
)


def _segment(index: int, words: list[tuple[str, float, float]]) -> Segment:
    timed = [Word(text, start, end, 0.9) for text, start, end in words]
    return Segment(index, 0, timed[0].start, timed[-1].end + 0.1, "".join(w.word for w in timed), [], 0.0, -0.2,
                   1.2, 0.01, timed)


def _transcript(*segments: Segment) -> Transcript:
    return Transcript("".join(s.text for s in segments), "en", list(segments), TranscriptionStats())


@pytest.fixture
def fox() -> Transcript:
    """Two segments, then a third after a pause of over 3 s."""
    return _transcript(
        _segment(0, [(" The", 0.0, 0.4), (" quick", 0.5, 0.9), (" brown", 1.0, 1.4), (" fox", 1.5, 1.9),
                     (" jumps", 2.0, 2.9)]),
        _segment(1, [(" over", 3.2, 3.6), (" the", 3.7, 3.9), (" lazy", 4.0, 4.5), (" dog.", 4.6, 5.5)]),
        _segment(2, [(" Again.", 10.0, 10.8)]),
    )


def _srt(transcript: Transcript, options: SubtitleOptions | None = None) -> str:
    out = io.StringIO()
    write_srt(transcript, out, options)
    return out.getvalue()


def _vtt(transcript: Transcript, options: SubtitleOptions | None = None) -> str:
    out = io.StringIO()
    write_vtt(transcript, out, options)
    return out.getvalue()


def test_with_words_and_no_layout_each_segment_is_a_cue_timed_by_its_words(fox) -> None:
    assert _srt(fox) == (
        "1\n00:00:00,000 --> 00:00:02,900\nThe quick brown fox jumps\n\n"
        "2\n00:00:03,200 --> 00:00:05,500\nover the lazy dog.\n\n"
        "3\n00:00:10,000 --> 00:00:10,800\nAgain.\n\n"
    )


def test_max_line_width_wraps_lines_within_each_segment(fox) -> None:
    assert _srt(fox, SubtitleOptions(max_line_width=10)) == (
        "1\n00:00:00,000 --> 00:00:02,900\nThe quick\nbrown fox\njumps\n\n"
        "2\n00:00:03,200 --> 00:00:05,500\nover the\nlazy dog.\n\n"
        "3\n00:00:10,000 --> 00:00:10,800\nAgain.\n\n"
    )


def test_max_line_count_flows_words_across_segments_into_new_cues(fox) -> None:
    # Two lines a cue; "jumps over" joins two segments; the pause before "Again." starts a cue of its own.
    assert _vtt(fox, SubtitleOptions(max_line_width=10, max_line_count=2)) == (
        "WEBVTT\n\n"
        "00:00.000 --> 00:01.900\nThe quick\nbrown fox\n\n"
        "00:02.000 --> 00:04.500\njumps over\nthe lazy\n\n"
        "00:04.600 --> 00:05.500\ndog.\n\n"
        "00:10.000 --> 00:10.800\nAgain.\n\n"
    )


def test_max_words_per_line_cuts_each_segment_into_cues_of_n_words(fox) -> None:
    assert _srt(fox, SubtitleOptions(max_words_per_line=2)) == (
        "1\n00:00:00,000 --> 00:00:00,900\nThe quick\n\n"
        "2\n00:00:01,000 --> 00:00:01,900\nbrown fox\n\n"
        "3\n00:00:02,000 --> 00:00:02,900\njumps\n\n"
        "4\n00:00:03,200 --> 00:00:03,900\nover the\n\n"
        "5\n00:00:04,000 --> 00:00:05,500\nlazy dog.\n\n"
        "6\n00:00:10,000 --> 00:00:10,800\nAgain.\n\n"
    )


def test_max_words_per_line_has_no_effect_with_max_line_width(fox) -> None:
    options = SubtitleOptions(max_line_width=10, max_words_per_line=1)
    assert _srt(fox, options) == _srt(fox, SubtitleOptions(max_line_width=10))
    assert options.ineffective() == ["max_words_per_line has no effect with max_line_width"]
    assert SubtitleOptions(max_line_count=2).ineffective() == ["max_line_count has no effect without max_line_width"]
    assert _srt(fox, SubtitleOptions(max_line_count=1)) == _srt(fox)


def test_highlight_words_underlines_each_word_in_its_own_cue_with_plain_gaps() -> None:
    transcript = _transcript(_segment(0, [(" Hi", 0.0, 0.5), (" there", 0.8, 1.2)]))
    assert _vtt(transcript, SubtitleOptions(highlight_words=True)) == (
        "WEBVTT\n\n"
        "00:00.000 --> 00:00.500\n<u>Hi</u> there\n\n"
        "00:00.500 --> 00:00.800\nHi there\n\n"
        "00:00.800 --> 00:01.200\nHi <u>there</u>\n\n"
    )
    # On a wrapped line the underline goes inside the line break.
    assert _srt(transcript, SubtitleOptions(max_line_width=3, highlight_words=True)) == (
        "1\n00:00:00,000 --> 00:00:00,500\n<u>Hi</u>\nthere\n\n"
        "2\n00:00:00,500 --> 00:00:00,800\nHi\nthere\n\n"
        "3\n00:00:00,800 --> 00:00:01,200\nHi\n<u>there</u>\n\n"
    )


def test_without_words_layout_options_leave_one_cue_per_segment() -> None:
    plain = Segment(0, 0, 0.0, 2.0, " A segment --> with an arrow", [], 0.0, -0.2, 1.2, 0.01, None)
    transcript = _transcript(plain)
    expected = "1\n00:00:00,000 --> 00:00:02,000\nA segment -> with an arrow\n\n"
    assert _srt(transcript) == expected
    assert _srt(transcript, SubtitleOptions(max_line_width=5, max_line_count=1, highlight_words=True)) == expected


def test_a_segment_without_words_among_timed_ones_keeps_its_text(fox) -> None:
    wordless = Segment(3, 0, 12.0, 13.0, " No words here.", [], 0.0, -0.2, 1.2, 0.01, None)
    cues = list(subtitle_cues(_transcript(*fox.segments, wordless)))
    assert cues[-1] == (12.0, 13.0, "No words here.")


@pytest.mark.parametrize("field", ["max_line_width", "max_line_count", "max_words_per_line"])
@pytest.mark.parametrize("value", [0, -3, 2.5, True])
def test_bad_widths_and_counts_are_refused(field: str, value) -> None:
    with pytest.raises(ValueError, match=f"{field} must be a positive integer"):
        SubtitleOptions(**{field: value})


def test_write_outputs_lays_out_srt_and_vtt_only_and_names_channels(fox, tmp_path) -> None:
    options = SubtitleOptions(max_words_per_line=1)
    written = write_outputs(fox, "calls/talk.wav", tmp_path, ("srt", "vtt", "txt"), options, suffix=".left")
    assert [p.name for p in written] == ["talk.left.srt", "talk.left.vtt", "talk.left.txt"]
    assert (tmp_path / "talk.left.srt").read_text() == _srt(fox, options)
    assert (tmp_path / "talk.left.vtt").read_text() == _vtt(fox, options)
    assert (tmp_path / "talk.left.txt").read_text().splitlines() == [s.text.strip() for s in fox.segments]
    assert not list(tmp_path.glob("*.partial"))


def test_blank_words_and_line_breaks_in_words_never_end_a_cue_early() -> None:
    # A blank line ends an srt/vtt cue whatever follows it; a cue of white space alone would be a blank cue.
    transcript = _transcript(_segment(0, [(" one", 0.0, 0.5), ("\n\n", 0.5, 0.6), (" two -", 0.6, 1.0),
                                          ("->", 1.0, 1.2)]),
                             _segment(1, [(" ", 2.0, 2.5)]))
    assert _srt(transcript) == "1\n00:00:00,000 --> 00:00:01,200\none\ntwo ->\n\n"
    assert _vtt(transcript) == "WEBVTT\n\n00:00.000 --> 00:01.200\none\ntwo ->\n\n"
