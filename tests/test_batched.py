"""Batched long-form (`--batch-size`) and VAD (`--vad`) with the real base model: same words whatever the batch
size or assistant, no text in silence or noise, times in the recording, every writer."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from click.testing import CliRunner

from asr.assist.choose import make_assistant
from asr.cli import main
from asr.transcription import transcribe, transcribe_many
from asr.options import TranscribeOptions
from audio import SAMPLE_RATE, load_audio
from audio.vad import VadOptions
from eval.wer import error_counts
from tests.conftest import SAMPLES, evaldata, manifest

pytestmark = pytest.mark.slow
pytest.importorskip("silero_vad")

GREEDY = dict(language="en", temperatures=(0.0,))


@pytest.fixture(scope="module")
def sonnets() -> np.ndarray:
    """The three sonnets back to back: 158 s, six chunks."""
    return np.concatenate([load_audio(evaldata("longform", f"p00{i}.mp3")) for i in (1, 2, 3)])


@pytest.fixture(scope="module")
def by_batch_size(base, sonnets) -> dict[int, object]:
    # With timestamp tokens (not the batched default): chunks that the model ends early get a continuation window.
    return {n: transcribe(base, sonnets, TranscribeOptions(batch_size=n, timestamps=True, **GREEDY)) for n in (1, 4, 8)}


def _words(result) -> list[tuple]:
    return [(s.start, s.end, s.tokens) for s in result.segments]


def test_batched_output_is_the_same_at_batch_sizes_1_4_and_8(by_batch_size, sonnets) -> None:
    one = by_batch_size[1]
    assert _words(by_batch_size[4]) == _words(one)
    assert _words(by_batch_size[8]) == _words(one)
    duration = len(sonnets) / SAMPLE_RATE
    previous_end = 0.0
    for segment in one.segments:
        assert previous_end - 0.01 <= segment.start < segment.end <= duration + 0.01
        previous_end = segment.end
    assert [s.id for s in one.segments] == list(range(len(one.segments)))
    rows = {r["audio"]: r for r in manifest("longform")}
    reference = " ".join(rows[f"p00{i}.mp3"]["text_body"] for i in (1, 2, 3))
    assert error_counts([reference], [one.text]).rate < 0.15  # sequential greedy: 10.5 %


def test_batched_with_an_assistant_gives_the_plain_batched_words(base, sonnets, by_batch_size) -> None:
    options = TranscribeOptions(batch_size=8, timestamps=True, **GREEDY)
    result = transcribe(base, sonnets, options, make_assistant("self:int8", base))
    assert _words(result) == _words(by_batch_size[8])
    assert result.stats.generation.accepted_tokens > 0


def test_several_files_share_the_batches(base) -> None:
    clips = [load_audio(SAMPLES / f"{name}.flac") for name in ("park", "numbers", "station")]
    options = TranscribeOptions(batch_size=4, **GREEDY)
    together = transcribe_many(base, clips, options, batch_size=1)
    alone = [transcribe(base, clip, replace(options, batch_size=1)) for clip in clips]
    assert [_words(r) for r in together] == [_words(r) for r in alone]
    assert all(r.text.strip() for r in together)


@pytest.fixture(scope="module")
def speech_silence_speech() -> tuple[np.ndarray, tuple[float, float]]:
    park, station = load_audio(SAMPLES / "park.flac"), load_audio(SAMPLES / "station.flac")
    start = len(park) / SAMPLE_RATE
    return np.concatenate([park, np.zeros(60 * SAMPLE_RATE, dtype=np.float32), station]), (start, start + 60)


@pytest.mark.parametrize("options", [TranscribeOptions(vad=VadOptions(), **GREEDY),
                                     TranscribeOptions(batch_size=8, **GREEDY)], ids=["vad", "batched"])
def test_no_text_in_silence_or_noise(base, speech_silence_speech, options: TranscribeOptions) -> None:
    silence = np.zeros(60 * SAMPLE_RATE, dtype=np.float32)
    noise = np.random.default_rng(0).normal(0, 0.05, 60 * SAMPLE_RATE).astype(np.float32)
    assert transcribe(base, silence, options).text == ""
    assert transcribe(base, noise, options).text == ""
    audio, (quiet_from, quiet_to) = speech_silence_speech
    result = transcribe(base, audio, options)
    spoken = "The sun was shining and the children were playing in the park. " \
             "We walked to the station and waited for the last train home."
    assert error_counts([spoken], [result.text]).rate <= 0.1, result.text
    for segment in result.segments:
        assert segment.end <= quiet_from + 0.5 or segment.start >= quiet_to - 0.5, segment


def test_vad_times_are_the_recordings(base, speech_silence_speech) -> None:
    audio, (quiet_from, quiet_to) = speech_silence_speech
    result = transcribe(base, audio, TranscribeOptions(vad=VadOptions(), word_timestamps=True, **GREEDY))
    words = [w for s in result.segments for w in s.words]
    station = [w for w in words if w.word.strip().startswith("station")]
    assert station and station[0].start > quiet_to
    assert all(w.end <= quiet_from + 0.5 or w.start >= quiet_to - 0.5 for w in words)
    assert words[-1].end <= len(audio) / SAMPLE_RATE


def test_the_command_writes_every_format_in_batched_mode(base, speech_silence_speech, tmp_path: Path) -> None:
    audio, (_, quiet_to) = speech_silence_speech
    path = tmp_path / "talk.flac"
    sf.write(path, audio, SAMPLE_RATE)
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["transcribe", str(path), "--batch-size", "4", "--word-timestamps",
                                       "--language", "en", "-f", "all", "-o", str(out), "-q"])
    assert result.exit_code == 0, result.output
    data = json.loads((out / "talk.json").read_text())
    assert data["stats"]["vad_seconds"] > 0
    assert data["segments"][-1]["start"] >= quiet_to - 0.5 and data["segments"][-1]["words"]
    srt = (out / "talk.srt").read_text()
    assert "00:01:0" in srt  # the second sentence, after the minute of silence
    for fmt in ("txt", "vtt", "tsv"):
        assert "station" in (out / f"talk.{fmt}").read_text()


def test_by_default_the_batched_mode_gives_one_segment_per_chunk(base, sonnets) -> None:
    # No timestamp tokens unless asked for (faster-whisper's batched pipeline does the same).
    result = transcribe(base, sonnets, TranscribeOptions(batch_size=8, **GREEDY))
    assert len(result.segments) == result.stats.windows
    assert all(s.end - s.start <= 30.0 for s in result.segments)
    assert result.segments[0].start < 1.0 and result.segments[-1].end > 150


def test_asr_batch_chunked_gives_a_row_per_item(base, tmp_path: Path) -> None:
    folder = tmp_path / "items"
    folder.mkdir()
    park = load_audio(SAMPLES / "park.flac")
    sf.write(folder / "a-park.flac", park, SAMPLE_RATE)
    sf.write(folder / "b-silence.flac", np.zeros(40 * SAMPLE_RATE, dtype=np.float32), SAMPLE_RATE)
    sf.write(folder / "c-park-pause-park.flac", np.concatenate([park, np.zeros(35 * SAMPLE_RATE, np.float32), park]),
             SAMPLE_RATE)
    output = tmp_path / "rows.jsonl"
    result = CliRunner().invoke(main, ["batch", str(folder), "-o", str(output), "--chunked", "--batch-size", "3",
                                       "--language", "en", "--segments", "-q"])
    assert result.exit_code == 0, result.output
    rows = {json.loads(line)["id"]: json.loads(line) for line in output.read_text().splitlines()}
    assert len(rows) == 3 and all(row["error"] is None for row in rows.values())
    alone = transcribe(base, park, TranscribeOptions(language="en", timestamps=False)).text
    assert rows["a-park.flac"]["text"] == alone  # a clip up to 30 s is decoded whole: the sequential words
    assert rows["b-silence.flac"]["text"] == ""
    segments = rows["c-park-pause-park.flac"]["segments"]
    assert len(segments) >= 2 and segments[-1]["start"] > 35
