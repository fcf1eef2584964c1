"""`asr transcribe -o DIR` under misuse: inputs with the same name, a folder that cannot be written, a disk
that fills up. No result overwrites another, and no work is done that cannot be kept."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from click.testing import CliRunner

import asr.writers
from asr.cli import main
from asr.writers import output_stems


def _tone(path: Path, hz: float) -> Path:
    t = np.arange(16000) / 16000
    path.parent.mkdir(parents=True, exist_ok=True)
    sf.write(path, (0.3 * np.sin(2 * np.pi * hz * t)).astype(np.float32), 16000)
    return path


def _run(folder: Path, *args: str):
    return CliRunner().invoke(main, ["transcribe", *args, "--model", str(folder), "-q", "--temperature", "0"])


def test_output_names_are_unique_and_readable() -> None:
    assert output_stems(["talk.wav", "other.mp3"]) == ["talk", "other"]
    assert output_stems(["a.wav", "a.mp3"]) == ["a.wav", "a.mp3"]
    assert output_stems(["/r/d1/x.wav", "/r/d2/x.wav"]) == ["d1_x.wav", "d2_x.wav"]
    assert output_stems(["a.wav", "a.wav"]) == ["a.wav", "a.wav-2"]


def test_inputs_with_the_same_stem_keep_both_results(tiny_whisper_folder: Path, tmp_path: Path) -> None:
    inputs = [_tone(tmp_path / "a.wav", 220), _tone(tmp_path / "a.flac", 440),
              _tone(tmp_path / "d1" / "x.wav", 330), _tone(tmp_path / "d2" / "x.wav", 550)]
    out = tmp_path / "out"
    result = _run(tiny_whisper_folder, *map(str, inputs), "-f", "json", "-o", str(out))
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in out.iterdir()) == ["a.flac.json", "a.wav.json", "d1_x.wav.json", "d2_x.wav.json"]
    for name, source in [("a.wav.json", inputs[0]), ("d2_x.wav.json", inputs[3])]:  # each holds its own input
        alone = _run(tiny_whisper_folder, str(source), "-f", "json")
        assert json.loads((out / name).read_text())["segments"] == json.loads(alone.stdout)["segments"]


def test_an_unwritable_output_folder_fails_before_any_work(tiny_whisper_folder: Path, tmp_path: Path) -> None:
    clip = _tone(tmp_path / "a.wav", 220)
    blocker = tmp_path / "file"
    blocker.write_text("a file where the folder should be")
    result = _run(tiny_whisper_folder, str(clip), "-o", str(blocker / "out"))
    assert result.exit_code == 1 and "cannot write the results there" in result.output
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1


def test_a_full_disk_is_reported_per_file_and_the_run_goes_on(tiny_whisper_folder: Path, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    clips = [_tone(tmp_path / "first.wav", 220), _tone(tmp_path / "second.wav", 440)]
    real = asr.writers.write_format

    def full_for_first(fmt, transcript, file, subtitles=None):
        if Path(file.name).name.startswith("first"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fmt, transcript, file, subtitles)

    monkeypatch.setattr(asr.writers, "write_format", full_for_first)
    out = tmp_path / "out"
    result = _run(tiny_whisper_folder, *map(str, clips), "-o", str(out))
    assert result.exit_code == 1 and "No space left on device" in result.stderr
    assert sorted(p.name for p in out.iterdir()) == ["second.txt"]  # no half-written file either


def test_a_temperature_of_nan_is_a_one_line_error(tiny_whisper_folder: Path, tmp_path: Path) -> None:
    clip = _tone(tmp_path / "a.wav", 220)
    result = CliRunner().invoke(main, ["transcribe", str(clip), "--model", str(tiny_whisper_folder),
                                       "--temperature", "0,nan"])
    assert result.exit_code == 1 and "temperatures" in result.output and "Traceback" not in result.output
