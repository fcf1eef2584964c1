"""Voice activity detection, chunking and the time maps; option errors through the CLI. No Whisper weights."""

from __future__ import annotations

import gc
import math
import subprocess
import sys
import weakref
from types import SimpleNamespace

import numpy as np
import pytest
from click.testing import CliRunner

from asr.speech import Chunk, SpeechMap, merge_chunks, shift_segments
from asr.cli import main
from asr.options import BATCHED_VAD, TranscribeOptions
from asr.results import Segment, Word
from audio import N_SAMPLES, SAMPLE_RATE, load_audio
from audio.vad import SpeechRegion, VadOptions, speech_regions
from tests.conftest import REPO, SAMPLES

pytest.importorskip("silero_vad")


@pytest.fixture(scope="module")
def park() -> np.ndarray:
    return load_audio(SAMPLES / "park.flac")


def seconds(n: float) -> int:
    return int(n * SAMPLE_RATE)


def test_digital_silence_and_white_noise_hold_no_speech() -> None:
    silence = np.zeros(seconds(60), dtype=np.float32)
    noise = np.random.default_rng(0).normal(0, 0.05, seconds(60)).astype(np.float32)
    for options in (VadOptions(), BATCHED_VAD):
        assert speech_regions(silence, options) == []
        assert speech_regions(noise, options) == []


def test_speech_around_a_minute_of_silence_gives_regions_outside_it(park: np.ndarray) -> None:
    audio = np.concatenate([park, np.zeros(seconds(60), dtype=np.float32), park])
    silent = (len(park), len(park) + seconds(60))
    regions = speech_regions(audio, VadOptions())
    assert len(regions) == 2
    pad = seconds(0.4)
    for region in regions:
        assert region.end <= silent[0] + pad or region.start >= silent[1] - pad
        assert region.end - region.start > seconds(2)


def test_the_vad_keeps_the_callers_thread_count() -> None:
    # In a fresh process: importing silero_vad sets torch's thread count to 1 once, at its first import (it
    # halved every encoder pass after the first VAD call before this was caught).
    script = (
        "import numpy as np, torch\n"
        "torch.set_num_threads(3)\n"
        "from audio.vad import VadOptions, speech_regions\n"
        "speech_regions(np.zeros(16000, dtype=np.float32), VadOptions())\n"
        "assert torch.get_num_threads() == 3, torch.get_num_threads()\n"
    )
    subprocess.run([sys.executable, "-c", script], check=True, cwd=REPO)


@pytest.mark.parametrize("field, value, message", [
    ("threshold", 0.0, "threshold must be between 0 and 1"),
    ("threshold", 1.2, "threshold must be between 0 and 1"),
    ("neg_threshold", 0.6, "negative threshold"),
    ("min_speech_duration_ms", -1, "min_speech_duration_ms must be >= 0"),
    ("min_silence_duration_ms", -5, "min_silence_duration_ms must be >= 0"),
    ("speech_pad_ms", -1, "speech_pad_ms must be >= 0"),
    ("max_speech_duration_s", 0.5, "max_speech_duration_s must be more than 1 s"),
    ("max_speech_duration_s", math.nan, "max_speech_duration_s must be more than 1 s"),
])
def test_vad_options_out_of_range_are_refused(field: str, value: float, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        VadOptions(**{field: value})


def test_batch_size_below_one_is_refused_and_chunks_are_capped_at_a_window() -> None:
    with pytest.raises(ValueError, match="batch size must be >= 1"):
        TranscribeOptions(batch_size=0)
    assert TranscribeOptions(batch_size=4).chunk_vad == BATCHED_VAD
    assert TranscribeOptions(batch_size=4, vad=VadOptions()).chunk_vad.max_speech_duration_s == 30.0
    assert TranscribeOptions(batch_size=4, vad=VadOptions(max_speech_duration_s=12)).chunk_vad.max_speech_duration_s == 12


def test_regions_merge_into_chunks_of_at_most_a_window() -> None:
    def r(a: float, b: float) -> SpeechRegion:
        return SpeechRegion(seconds(a), seconds(b))

    assert merge_chunks([], N_SAMPLES) == []
    chunks = merge_chunks([r(1, 5), r(6, 20), r(22, 31), r(33, 40), r(70, 71)], N_SAMPLES)
    assert chunks == [Chunk(seconds(1), seconds(31)), Chunk(seconds(33), seconds(40)), Chunk(seconds(70), seconds(71))]
    # A region longer than a window is cut into windows.
    chunks = merge_chunks([r(0, 70)], N_SAMPLES)
    assert [(c.start, c.end) for c in chunks] == [(0, seconds(30)), (seconds(30), seconds(60)), (seconds(60), seconds(70))]
    assert all(c.end - c.start <= N_SAMPLES for c in chunks)


def _segment(start: float, end: float, words: list[tuple[float, float]] | None = None) -> Segment:
    return Segment(0, 0, start, end, " x", [1], 0.0, -0.1, 1.0, 0.0,
                   [Word(" x", a, b, 0.9) for a, b in words] if words is not None else None)


def test_chunk_times_move_to_the_recording() -> None:
    segment = _segment(1.0, 2.5, [(1.0, 1.5)])
    shift_segments([segment], Chunk(seconds(100), seconds(120)))
    assert (segment.start, segment.end, segment.seek) == (101.0, 102.5, 10000)
    assert (segment.words[0].start, segment.words[0].end) == (101.0, 101.5)


def test_speech_map_restores_times_across_the_gaps() -> None:
    audio = np.arange(seconds(20), dtype=np.float32)
    regions = [SpeechRegion(seconds(2), seconds(5)), SpeechRegion(seconds(10), seconds(12))]
    speech_map = SpeechMap(regions)
    speech = speech_map.speech(audio)
    assert len(speech) == seconds(5) and speech[0] == seconds(2) and speech[seconds(3)] == seconds(10)
    assert speech_map.original_time(0.0) == 2.0
    assert speech_map.original_time(3.0) == 10.0  # a start on the join belongs to the later region
    assert speech_map.original_time(3.0, is_end=True) == 5.0  # an end to the earlier one
    assert speech_map.original_time(4.5, is_end=True) == 11.5
    segment = _segment(1.0, 3.0, [(1.0, 2.0), (3.0, 4.0)])
    speech_map.restore([segment])
    assert (segment.start, segment.end) == (3.0, 5.0)
    assert [(w.start, w.end) for w in segment.words] == [(3.0, 4.0), (10.0, 11.0)]
    assert SpeechMap([]).speech(audio).size == 0
    # Across the join: kept to the region holding most of it (1 s before the join, 1.5 s after), words one by one.
    crossing = _segment(2.0, 4.5, [(2.0, 2.5), (3.2, 4.5)])
    speech_map.restore([crossing])
    assert (crossing.start, crossing.end) == (10.0, 11.5)
    assert [(w.start, w.end) for w in crossing.words] == [(4.0, 4.5), (10.2, 11.5)]


class _StubDecoder:
    """Stands in for the window decoder: every window is done at once, without text; counts live chunks."""

    def __init__(self, options: TranscribeOptions) -> None:
        self.options = options
        self.texts = SimpleNamespace(initial=[])
        self.batches: list[int] = []
        self.alive: list[int] = []
        self.refs: list[weakref.ref] = []

    def detect_language(self, window: np.ndarray):
        return "en", {"en": 1.0}

    def decode(self, items) -> None:
        self.refs += [weakref.ref(item) for item in items]
        gc.collect()
        self.alive.append(sum(ref() is not None for ref in self.refs))
        self.batches.append(len(items))
        for item in items:
            item.consume([], item.segment_size, 0.0)


def test_batched_mode_makes_chunks_as_the_batch_advances(park: np.ndarray) -> None:
    from asr.transcription import Transcriber

    gap = np.zeros(seconds(1), dtype=np.float32)
    audio = np.tile(np.concatenate([park, gap]), 60)  # ~5.6 minutes of speech: ~12 chunks
    decoder = _StubDecoder(TranscribeOptions(batch_size=4))
    transcriber = Transcriber.__new__(Transcriber)  # its checks need a model; the stub decoder needs none
    transcriber.language, transcriber.options, transcriber.decoder = None, decoder.options, decoder
    result, = transcriber.transcribe_many([audio])
    assert sum(decoder.batches) >= 10 and max(decoder.batches) == 4
    # Chunks not yet in a batch do not exist, and finished ones are gone: two batches' worth at most.
    assert max(decoder.alive) <= 8, decoder.alive
    assert result.text == "" and result.language == "en"
    assert result.stats.audio_seconds == pytest.approx(len(audio) / SAMPLE_RATE)
    assert result.stats.vad_seconds > 0


def _invoke(*args: str):
    return CliRunner().invoke(main, ["transcribe", str(SAMPLES / "park.flac"), *args])


@pytest.mark.parametrize("args, message", [
    (["--batch-size", "0"], "batch size must be >= 1, got 0"),
    (["--batch-size", "-3"], "batch size must be >= 1, got -3"),
    (["--vad-threshold", "1.5"], "VAD threshold must be between 0 and 1, got 1.5"),
    (["--vad", "--vad-min-silence-ms", "-1"], "VAD min_silence_duration_ms must be >= 0"),
    (["--batch-size", "8", "--vad-max-speech-s", "0"], "VAD max_speech_duration_s must be more than 1 s"),
])
def test_bad_options_give_one_line_and_a_non_zero_exit(args: list[str], message: str) -> None:
    result = _invoke(*args)
    assert result.exit_code != 0
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0], result.output
    assert "Traceback" not in result.output
