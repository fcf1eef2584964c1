"""Property-based fuzzing of the text a user types: `--clip-timestamps`, `--suppress-tokens`, the prompt, prefix
and hotword texts, and the subtitle layout values. Each is parsed and checked into options or refused in one
line; options that pass transcribe (a tiny random Whisper, two seconds of noise) into sane segments; and any
layout of any words writes well-formed subtitles that hold every word in order.
"""

from __future__ import annotations

import io
import re

import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, event, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from asr.models.registry import load_model  # noqa: E402
from asr.options import (  # noqa: E402
    TranscribeOptions,
    check_for_model,
    parse_clip_timestamps,
    parse_suppress_tokens,
    seek_clips,
)
from asr.results import Segment, Transcript, TranscriptionStats, Word  # noqa: E402
from asr.transcription import transcribe  # noqa: E402
from asr.writers import SubtitleOptions, write_srt, write_vtt  # noqa: E402

PARSING = settings(max_examples=300, deadline=None, derandomize=True,
                   suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
DECODING = settings(PARSING, max_examples=60)  # each example transcribes two seconds

# What a user may type where numbers are expected: numbers of every form, and the text around them.
NUMBER_TEXT = st.lists(st.one_of(
    st.sampled_from(["0", "1", "-1", "2.5", "1e400", "-1e400", "nan", "inf", "-inf", "1_0", " 3 ", "+4", "0x10",
                     "9" * 30, "9" * 5000, "", "50257", "51864", "51865", "-2", "1.", ".5", "٣", "a", "1,2"]),
    st.text(max_size=4)), max_size=6).map(",".join)
# Lists that parse (the test above tries the rest), to reach the decoding: clip seconds in any order, past the
# audio's end, and token ids.
CLIPS = st.lists(st.sampled_from([0, 0.5, 1, 1.9, 2, 2.5, 30, 1e9]), max_size=5).map(
    lambda clips: ",".join(map(str, clips)))
SUPPRESS = st.lists(st.sampled_from([-1, 0, 11, 50256, 50257, 50359, 50363, 50364, 51864]), max_size=5).map(
    lambda ids: ",".join(map(str, ids)))
TEXT = st.one_of(st.text(max_size=40), st.sampled_from(["", " ", "\n\n", "\x00", "<|endoftext|>", "<|0.00|>",
                                                        "<|startoftranscript|><|en|>", "a" * 3000, "é" * 500]))


def _one_line(error: Exception) -> None:
    message = str(error).strip()
    assert message and "\n" not in message and len(message) < 2000, message[:300]


@pytest.fixture(scope="module")
def bundle(tiny_whisper_folder):
    return load_model(str(tiny_whisper_folder))


@PARSING
@given(clips=NUMBER_TEXT, suppress=NUMBER_TEXT, frames=st.integers(0, 10 ** 6))
def test_number_lists_parse_into_options_or_are_one_line(bundle, clips: str, suppress: str, frames: int) -> None:
    try:
        options = TranscribeOptions(clip_timestamps=parse_clip_timestamps(clips),
                                    suppress_tokens=parse_suppress_tokens(suppress))
        check_for_model(options, bundle)
    except ValueError as error:
        _one_line(error)
        return
    for start, end in seek_clips(options.clip_timestamps, frames):
        assert 0 <= start <= end <= frames


@DECODING
@given(clips=CLIPS, suppress=SUPPRESS, prompt=st.one_of(st.none(), TEXT), prefix=st.one_of(st.none(), TEXT),
       hotwords=st.one_of(st.none(), TEXT), carry=st.booleans(), beam=st.sampled_from([None, 2]))
def test_any_typed_text_transcribes_or_is_one_line(bundle, clips: str, suppress: str, prompt: str | None,
                                                   prefix: str | None, hotwords: str | None, carry: bool,
                                                   beam: int | None) -> None:
    audio = np.random.default_rng(0).normal(0, 0.1, 2 * 16000).astype(np.float32)
    try:
        options = TranscribeOptions(
            language="en", temperatures=(0.0,), max_new_tokens=12, clip_timestamps=parse_clip_timestamps(clips),
            suppress_tokens=parse_suppress_tokens(suppress), initial_prompt=prompt, prefix=prefix,
            hotwords=hotwords, carry_initial_prompt=carry, beam_size=beam)
        transcript = transcribe(bundle, audio, options)
    except ValueError as error:
        _one_line(error)
        event("refused")
        return
    event("transcribed")
    for segment in transcript.segments:
        assert 0 <= segment.start <= segment.end <= 2.0 + 1e-6


LAYOUT_VALUE = st.one_of(st.none(), st.sampled_from([0, -1, 1, 2, 3, 42, 10 ** 18, True, 2.5, "3"]))
WORD_TEXT = st.one_of(st.text(max_size=8), st.sampled_from([" -->", "\n", "\n\n", " ", "", "<u>", " a" * 50]))


def _transcript(draw_words: list[list[tuple[str, float, float]]], text_only: bool) -> Transcript:
    segments, clock = [], 0.0
    for index, words in enumerate(draw_words):
        timed = []
        for text, gap, length in words:
            timed.append(Word(text, clock + gap, clock + gap + length, 0.9))
            clock += gap + length
        start = timed[0].start if timed else clock
        segments.append(Segment(id=index, seek=0, start=start, end=max(clock, start),
                                text="".join(w.word for w in timed), tokens=[], temperature=0.0, avg_logprob=-0.1,
                                compression_ratio=1.0, no_speech_prob=0.0, words=None if text_only else timed))
    return Transcript(text="".join(s.text for s in segments), language="en", segments=segments,
                      stats=TranscriptionStats())


@PARSING
@given(width=LAYOUT_VALUE, count=LAYOUT_VALUE, per_line=LAYOUT_VALUE, highlight=st.booleans(),
       text_only=st.booleans(),
       words=st.lists(st.lists(st.tuples(WORD_TEXT, st.sampled_from([0.0, 0.0004, 0.3, 4.0]),
                                         st.sampled_from([0.0, 0.2, 1.0])), max_size=6), max_size=4))
def test_any_subtitle_layout_writes_well_formed_cues_with_every_word(width, count, per_line, highlight: bool,
                                                                     text_only: bool, words: list) -> None:
    try:
        layout = SubtitleOptions(max_line_width=width, max_line_count=count, max_words_per_line=per_line,
                                 highlight_words=highlight)
    except ValueError as error:
        _one_line(error)
        return
    transcript = _transcript(words, text_only)
    srt, vtt = io.StringIO(), io.StringIO()
    write_srt(transcript, srt, layout)
    write_vtt(transcript, vtt, layout)
    assert vtt.getvalue().startswith("WEBVTT\n\n")
    for document, blocks, header in ((srt.getvalue(), [], 2), (vtt.getvalue()[len("WEBVTT\n\n"):], [], 1)):
        # A cue is its number (srt), its times, and text lines none of which is blank (a blank line ends a cue).
        blocks = [b for b in document.split("\n\n") if b]
        said = []
        for number, block in enumerate(blocks, start=1):
            lines = block.split("\n")
            if header == 2:
                assert lines[0] == str(number)
            times = lines[header - 1]
            assert re.fullmatch(r"(\d\d:)?\d\d:\d\d[.,]\d{3} --> (\d\d:)?\d\d:\d\d[.,]\d{3}", times), block
            start, end = (_seconds(t) for t in times.split(" --> "))
            assert start <= end, block
            text = "\n".join(lines[header:])
            assert text.strip() and all(line.strip() for line in lines[header:]) and "-->" not in text, block
            said.append(text)
        if not highlight:
            expected = "".join(w for s in words for w, _, _ in s)
            assert _letters("".join(said)) == _letters(re.sub(r"--+>", "->", expected))


def _seconds(stamp: str) -> float:
    parts = stamp.replace(",", ".").split(":")
    return sum(float(p) * 60 ** i for i, p in enumerate(reversed(parts)))


def _letters(text: str) -> str:
    return re.sub(r"\s+", "", text)
