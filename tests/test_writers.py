"""The writers (`asr.writers`): the exact text of each format for a small hand-made transcript, timestamps,
`output_formats` and `write_outputs`."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from asr.results import Segment, Transcript, TranscriptionStats, Word
from asr.writers import (
    FORMATS,
    WRITERS,
    format_timestamp,
    output_formats,
    write_outputs,
)


def segment(index: int, start: float, end: float, text: str, words: list[Word] | None = None) -> Segment:
    return Segment(index, 0, start, end, text, [50364 + index], 0.0, -0.25, 1.2, 0.01, words)


def hand_made() -> Transcript:
    """Three segments: one past an hour, text with a tab, an arrow and padding spaces, and a word list."""
    segments = [
        segment(0, 0.0, 2.5, " Hello there.", [Word(" Hello", 0.0, 0.9, 0.5), Word(" there.", 1.0, 2.5, 0.75)]),
        segment(1, 65.4321, 70.0, " Tabs\there --> arrows  "),
        segment(2, 3725.5, 3727.0, " Late in the hour."),
    ]
    text = "".join(s.text for s in segments)
    return Transcript(text, "en", segments, TranscriptionStats(audio_seconds=3730.0, windows=3, total_seconds=10.0))


def written(fmt: str, transcript: Transcript | None = None) -> str:
    out = io.StringIO()
    WRITERS[fmt](transcript or hand_made(), out)
    return out.getvalue()


@pytest.mark.parametrize("seconds, kwargs, expected", [
    (0.0, {}, "00:00.000"),
    (1.0004, {}, "00:01.000"),  # rounded to the millisecond
    (1.0015, {}, "00:01.002"),
    (59.9996, {}, "01:00.000"),  # milliseconds carry into the seconds and minutes
    (65.4321, {}, "01:05.432"),
    (3599.9999, {}, "01:00:00.000"),  # hours appear once there are some
    (3725.5, {}, "01:02:05.500"),
    (-0.2, {}, "00:00.000"),  # never negative
    (5.25, {"always_include_hours": True, "decimal_marker": ","}, "00:00:05,250"),
    (36000.0, {"always_include_hours": True}, "10:00:00.000"),
])
def test_format_timestamp(seconds: float, kwargs: dict, expected: str) -> None:
    assert format_timestamp(seconds, **kwargs) == expected


def test_txt_is_one_stripped_line_per_segment() -> None:
    assert written("txt") == "Hello there.\nTabs\there --> arrows\nLate in the hour.\n"


def test_srt() -> None:
    assert written("srt") == (
        "1\n00:00:00,000 --> 00:00:02,500\nHello there.\n\n"
        "2\n00:01:05,432 --> 00:01:10,000\nTabs\there -> arrows\n\n"
        "3\n01:02:05,500 --> 01:02:07,000\nLate in the hour.\n\n"
    )


def test_vtt() -> None:
    assert written("vtt") == (
        "WEBVTT\n\n"
        "00:00.000 --> 00:02.500\nHello there.\n\n"
        "01:05.432 --> 01:10.000\nTabs\there -> arrows\n\n"
        "01:02:05.500 --> 01:02:07.000\nLate in the hour.\n\n"
    )


def test_tsv_has_integer_milliseconds_and_no_tab_in_the_text() -> None:
    assert written("tsv") == (
        "start\tend\ttext\n"
        "0\t2500\tHello there.\n"
        "65432\t70000\tTabs here --> arrows\n"
        "3725500\t3727000\tLate in the hour.\n"
    )


def test_json_holds_every_field_and_words_only_where_there_are_some() -> None:
    text = written("json")
    assert text.endswith("}\n") and text.count("\n") == 1
    data = json.loads(text)
    assert data["text"] == " Hello there. Tabs\there --> arrows   Late in the hour."
    assert data["language"] == "en"
    first, second, _ = data["segments"]
    assert first == {"id": 0, "seek": 0, "start": 0.0, "end": 2.5, "text": " Hello there.", "tokens": [50364],
                     "temperature": 0.0, "avg_logprob": -0.25, "compression_ratio": 1.2, "no_speech_prob": 0.01,
                     "words": [{"word": " Hello", "start": 0.0, "end": 0.9, "probability": 0.5},
                               {"word": " there.", "start": 1.0, "end": 2.5, "probability": 0.75}]}
    assert "words" not in second
    assert data["stats"]["audio_seconds"] == 3730.0 and data["stats"]["windows"] == 3


def test_json_keeps_non_ascii_text() -> None:
    transcript = Transcript(" Grüße, 世界", "de", [segment(0, 0.0, 1.0, " Grüße, 世界")], TranscriptionStats())
    assert "Grüße, 世界" in written("json", transcript)


def test_an_empty_transcript() -> None:
    empty = Transcript("", "en", [], TranscriptionStats())
    assert written("txt", empty) == ""
    assert written("srt", empty) == ""
    assert written("vtt", empty) == "WEBVTT\n\n"
    assert written("tsv", empty) == "start\tend\ttext\n"
    assert json.loads(written("json", empty))["segments"] == []


def test_output_formats() -> None:
    assert output_formats("all") == FORMATS == ("txt", "srt", "vtt", "tsv", "json")
    for fmt in FORMATS:
        assert output_formats(fmt) == (fmt,)
    with pytest.raises(ValueError, match=r"unknown output format 'doc'; choose one of txt, srt, vtt, tsv, json, all"):
        output_formats("doc")


def test_write_outputs_names_files_after_the_audio(tmp_path: Path) -> None:
    folder = tmp_path / "new" / "folder"
    paths = write_outputs(hand_made(), "/recordings/talk.v2.flac", folder, FORMATS)
    assert paths == [folder / f"talk.v2.{fmt}" for fmt in FORMATS]
    for fmt, path in zip(FORMATS, paths):
        assert path.read_text(encoding="utf-8") == written(fmt)
    assert sorted(p.name for p in folder.iterdir()) == sorted(p.name for p in paths)  # no .partial left


def test_write_outputs_replaces_an_earlier_file(tmp_path: Path) -> None:
    (tmp_path / "talk.txt").write_text("old text that is longer than the new one\n" * 20)
    assert write_outputs(hand_made(), "talk.wav", str(tmp_path), ("txt",)) == [tmp_path / "talk.txt"]
    assert (tmp_path / "talk.txt").read_text() == written("txt")
    assert [p.name for p in tmp_path.iterdir()] == ["talk.txt"]
