"""Audio files as users and hostile files give them: each case is built here, and each ends in samples that are
sane (finite, in [-1, 1], 16 kHz mono of the right length) or in one `AudioError` line that names the file.

Through `asr transcribe` every refused file is one line on stderr, the other files are still transcribed, and
the exit status is 1.
"""

from __future__ import annotations

import struct
import tracemalloc
from pathlib import Path
from typing import Callable

import numpy as np
import pytest
import soundfile as sf
from click.testing import CliRunner

import audio.load
from asr.cli import main
from audio import AudioError, load_audio


def _tone(seconds: float = 1.0, rate: int = 16000, channels: int = 1, amplitude: float = 0.5) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    mono = (amplitude * np.sin(2 * np.pi * 330 * t)).astype(np.float32)
    return np.stack([mono * (1 - 0.1 * c) for c in range(channels)], axis=1) if channels > 1 else mono


def _wav(path: Path, samples: np.ndarray, rate: int = 16000, subtype: str = "PCM_16") -> Path:
    sf.write(path, samples, rate, subtype=subtype)
    return path


def _with_rate(path: Path, rate: int) -> Path:
    """A valid WAV whose header then claims another sample rate (and byte rate)."""
    data = bytearray(_wav(path, _tone(0.5)).read_bytes())
    data[24:28] = struct.pack("<I", rate)
    data[28:32] = struct.pack("<I", rate * 2)
    path.write_bytes(bytes(data))
    return path


def _truncated(path: Path, suffix_bytes: int) -> Path:
    data = _wav(path, _tone(2.0), subtype="PCM_16" if path.suffix == ".wav" else None).read_bytes()
    path.write_bytes(data[:suffix_bytes] if suffix_bytes > 0 else data[:len(data) // 2])
    return path


def _bit_flipped(path: Path) -> Path:
    data = bytearray(_wav(path, _tone(2.0), subtype=None).read_bytes())
    for at in range(200, len(data), 97):
        data[at] ^= 0x5A
    path.write_bytes(bytes(data))
    return path


def _lying_length(path: Path) -> Path:
    """A WAV whose data chunk claims ten times the bytes the file holds."""
    data = bytearray(_wav(path, _tone(1.0)).read_bytes())
    at = data.index(b"data") + 4
    data[at:at + 4] = struct.pack("<I", struct.unpack("<I", data[at:at + 4])[0] * 10)
    path.write_bytes(bytes(data))
    return path


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


# name -> (make the file in a folder, expected: None for sane samples, else a piece of the error line)
CASES: dict[str, tuple[Callable[[Path], Path], str | None]] = {
    "missing": (lambda d: d / "missing.wav", "no such file"),
    "directory": (lambda d: (d / "folder.wav").mkdir() or d / "folder.wav", "is a directory"),
    "empty": (lambda d: _write(d / "empty.wav", b""), "empty"),
    "header only": (lambda d: _truncated(d / "header.wav", 44), "no audio samples"),
    "truncated wav": (lambda d: _truncated(d / "cut.wav", 0), None),
    "truncated flac": (lambda d: _truncated(d / "cut.flac", 0), "damaged audio data"),
    "bit-flipped flac": (lambda d: _bit_flipped(d / "flipped.flac"), "damaged audio data"),
    "not audio": (lambda d: _write(d / "notes.wav", b"just some text\n" * 20), "not a readable audio file"),
    "nan": (lambda d: _wav(d / "nan.wav", np.full(1600, np.nan, np.float32), subtype="FLOAT"), "NaN"),
    "inf": (lambda d: _wav(d / "inf.wav", np.full(1600, np.inf, np.float32), subtype="FLOAT"), "NaN or infinite"),
    "far out of range": (lambda d: _wav(d / "loud.wav", _tone(amplitude=50.0), subtype="FLOAT"),
                         "far outside [-1, 1]"),
    "a little out of range": (lambda d: _wav(d / "hot.wav", _tone(amplitude=1.3), subtype="FLOAT"), None),
    "digital silence": (lambda d: _wav(d / "silence.wav", np.zeros(16000, np.float32)), None),
    "noise": (lambda d: _wav(d / "noise.wav", np.random.default_rng(0).uniform(-1, 1, 16000).astype(np.float32)),
              None),
    "1 Hz header": (lambda d: _with_rate(d / "slow.wav", 1), "sample rate 1 Hz"),
    "10 MHz header": (lambda d: _with_rate(d / "fast.wav", 10_000_000), "sample rate 10000000 Hz"),
    "lying data length": (lambda d: _lying_length(d / "lying.wav"), None),
    **{f"{rate // 1000} kHz": ((lambda r: lambda d: _wav(d / f"r{r}.wav", _tone(1.0, r), r))(rate), None)
       for rate in (8000, 11025, 22050, 32000, 44100, 48000)},
    **{f"{channels} channels": ((lambda c: lambda d: _wav(d / f"c{c}.wav", _tone(1.0, 16000, c)))(channels), None)
       for channels in (1, 2, 3, 4, 5, 6)},
}


@pytest.mark.parametrize("case", list(CASES))
def test_every_file_gives_sane_samples_or_one_line(tmp_path: Path, case: str) -> None:
    make, expected = CASES[case]
    path = make(tmp_path)
    if expected is not None:
        with pytest.raises(AudioError) as raised:
            load_audio(path)
        message = str(raised.value)
        assert expected in message and str(path) in message and "\n" not in message
        return
    samples = load_audio(path)
    assert samples.dtype == np.float32 and samples.ndim == 1 and samples.flags.c_contiguous
    assert np.isfinite(samples).all() and np.abs(samples).max() <= 1.0
    info = sf.info(str(path))
    expected_length = info.frames * 16000 / info.samplerate
    assert abs(samples.size - expected_length) <= 2 or case.startswith(("truncated", "lying"))


def test_resampling_block_by_block_equals_one_call(tmp_path: Path) -> None:
    import soxr

    stereo = _tone(3.0, 44100, 2)
    path = _wav(tmp_path / "a.wav", stereo, 44100, subtype="FLOAT")
    whole = soxr.resample(stereo.mean(axis=1, dtype=np.float32), 44100, 16000, quality="HQ")
    np.testing.assert_array_equal(load_audio(path), whole)


def test_memory_is_bounded_by_the_16_khz_mono_result(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # 40 s of 48 kHz stereo float: 15 MB in the file, 2.6 MB as the 16 kHz mono result.
    path = _wav(tmp_path / "long.wav", _tone(40.0, 48000, 2), 48000, subtype="FLOAT")
    monkeypatch.setattr(audio.load, "_BLOCK_FRAMES", 1 << 15)  # blocks of 0.25 MB, so the bound is visible
    load_audio(path)  # imports and first-call caches out of the measurement
    tracemalloc.start()
    samples = load_audio(path)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    result = samples.nbytes
    assert peak < 2 * result + (2 << 20), f"peak {peak / 1e6:.1f} MB for a {result / 1e6:.1f} MB result"


def test_the_command_line_reports_each_bad_file_in_one_line(scripted_folder: Path, tmp_path: Path) -> None:
    good = _wav(tmp_path / "good.wav", _tone(1.0))
    bad = [CASES[name][0](tmp_path) for name in ("missing", "empty", "not audio", "1 Hz header", "far out of range")]
    result = CliRunner().invoke(main, ["transcribe", str(bad[0]), str(good), *map(str, bad[1:]), "--model",
                                       str(scripted_folder), "-q", "--temperature", "0", "-f", "json"])
    assert result.exit_code == 1 and "Traceback" not in result.output
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == len(bad) and all(str(path) in line for path, line in zip(bad, errors))
    assert '"segments"' in result.stdout  # the good file was transcribed
