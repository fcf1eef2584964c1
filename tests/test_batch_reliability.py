"""`asr batch` under misuse: concurrent runs, failed items, unreadable sources and awkward manifests.

Each case builds its own input and asserts the exact outcome: a one-line error and a non-zero exit, or the
right rows, each id once. A tiny random Whisper stands in for a real model (its words are noise; the rows are
what is checked).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from click.testing import CliRunner

from asr.batch.output import OutputLock, RowWriter, read_done_ids
from asr.batch.run import BatchOptions, prepare_output
from asr.batch.shards import merge_parts
from asr.batch.sources import iter_items
from asr.cli import main


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _tone(path: Path, seconds: float = 1.0) -> Path:
    t = np.arange(int(16000 * seconds)) / 16000
    sf.write(path, (0.1 * np.sin(2 * np.pi * 220 * t)).astype(np.float32), 16000)
    return path


def _batch(*args: str) -> object:
    return CliRunner().invoke(main, ["batch", *args, "-q", "--device", "cpu", "--threads", "1"])


HOLD_LOCK = textwrap.dedent("""
    import sys, time
    from asr.batch.output import OutputLock
    with OutputLock(sys.argv[1]):
        print("held", flush=True)
        time.sleep(60)
""")


@pytest.fixture
def other_run(tmp_path: Path):
    """Another process holding the lock of tmp_path/out.jsonl, as a running `asr batch` does."""
    output = tmp_path / "out.jsonl"
    process = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(output)], stdout=subprocess.PIPE, text=True,
                               cwd=Path(__file__).resolve().parents[1])
    assert process.stdout.readline().strip() == "held"
    yield output
    process.kill()
    process.wait()


def test_a_second_run_is_locked_out_for_the_whole_run(other_run: Path) -> None:
    # The first run may not have written a row yet (it is loading its model): the lock is held all the same.
    with pytest.raises(ValueError, match="another run is using this output"):
        prepare_output(other_run, BatchOptions())
    with pytest.raises(ValueError, match="another run is using this output"):
        prepare_output(other_run, BatchOptions(resume=True))


def test_overwrite_never_deletes_the_rows_of_a_running_run(other_run: Path) -> None:
    other_run.write_text('{"id": "a", "text": "kept", "error": null}\n')
    with pytest.raises(ValueError, match="another run"):
        prepare_output(other_run, BatchOptions(overwrite=True))
    assert _rows(other_run) == [{"id": "a", "text": "kept", "error": None}]


def test_the_lock_is_shared_within_one_process(tmp_path: Path) -> None:
    output = tmp_path / "out.jsonl"
    with prepare_output(output, BatchOptions()), OutputLock(output):
        pass  # run_batch takes the lock again under the command's: no conflict with itself
    with OutputLock(output):  # released: a later run may go
        pass


def test_a_writer_that_wrote_nothing_leaves_no_file(tmp_path: Path) -> None:
    output = tmp_path / "out.jsonl"
    with RowWriter(output):
        pass
    assert not output.exists()
    output.write_text("")
    with RowWriter(output):  # an existing file is never removed
        pass
    assert output.exists()


def test_retry_errors_drops_the_error_rows_and_merge_prefers_a_success(tmp_path: Path) -> None:
    output = tmp_path / "out.jsonl"
    output.write_text('{"id": "a", "error": null}\n{"id": "b", "error": "bad"}\n')
    assert read_done_ids(output) == {"a", "b"}
    assert read_done_ids(output, repair=True, drop_errors=True) == {"a"}
    assert [row["id"] for row in _rows(output)] == ["a"]

    output.write_text('{"id": "a", "error": null}\n{"id": "b", "error": "bad"}\n')
    part = tmp_path / "out.jsonl.part-00001-of-00002"
    part.write_text('{"id": "b", "error": null, "text": "now"}\n')
    assert merge_parts(output, ["a", "b"]) == 2
    assert _rows(output) == [{"id": "a", "error": None}, {"id": "b", "error": None, "text": "now"}]


def test_manifest_with_a_byte_order_mark(tmp_path: Path) -> None:
    clip = _tone(tmp_path / "a.wav")
    manifest = tmp_path / "m.csv"
    manifest.write_bytes("\ufeffaudio,text\n".encode() + f"{clip.name},hello\n".encode())
    items = list(iter_items(str(manifest)))
    assert [(i.audio, i.text, i.error) for i in items] == [(str(clip), "hello", None)]
    jsonl = tmp_path / "m.jsonl"
    jsonl.write_bytes("\ufeff".encode() + json.dumps({"audio": clip.name}).encode() + b"\n")
    assert [i.error for i in iter_items(str(jsonl))] == [None]


def test_an_open_quote_is_an_error_naming_the_line(tmp_path: Path) -> None:
    manifest = tmp_path / "m.csv"
    manifest.write_text('audio,text\na.wav,fine\n"b.wav,open quote\nc.wav,x\nd.wav,y\n')
    with pytest.raises(ValueError, match=r"m\.csv:\d+: malformed CSV"):
        list(iter_items(str(manifest)))


def test_a_json_array_manifest(tmp_path: Path) -> None:
    manifest = tmp_path / "m.json"
    manifest.write_text(json.dumps([{"audio": "a.wav", "id": "x"}, {"audio": "b.wav"}, 3]))
    items = list(iter_items(str(manifest)))
    assert [i.id for i in items[:2]] == ["x", "b.wav"] or [i.id for i in items[:2]][0] == "x"
    assert items[1].audio == str(tmp_path / "b.wav") and "not a JSON object" in items[2].error
    manifest.write_text('{"audio": "a.wav"}\n{"audio": "b.wav"}\n')  # JSON lines under .json still work
    assert len(list(iter_items(str(manifest)))) == 2


def test_a_missing_relative_path_is_not_sent_to_the_hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    for source in ("data/missing.jsonl", "data/clips", "nosuchdir/x.csv"):
        with pytest.raises(ValueError, match="no such file or folder"):
            list(iter_items(source))


def test_a_typo_in_source_leaves_no_file_behind(scripted_folder: Path, tmp_path: Path) -> None:
    output = tmp_path / "out.jsonl"
    result = _batch(str(tmp_path / "no-such-folder"), "-o", str(output), "--model", str(scripted_folder))
    assert result.exit_code == 1 and "no such file or folder" in result.output
    assert not output.exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    result = _batch(str(empty), "-o", str(output), "--model", str(scripted_folder))
    assert result.exit_code == 1 and "no items" in result.output and not output.exists()


def test_an_output_that_cannot_be_made_is_one_line(scripted_folder: Path, tmp_path: Path) -> None:
    clips = tmp_path / "clips"
    clips.mkdir()
    _tone(clips / "good.wav")
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    for output in ("/proc/asr_out/res.jsonl", str(blocker / "res.jsonl")):
        result = _batch(str(clips), "-o", output, "--model", str(scripted_folder))
        assert result.exit_code == 1 and "Traceback" not in result.output, result.output
        assert f"{output}: cannot write there" in result.output


def test_failed_items_give_a_non_zero_exit_and_retry_errors_redoes_them(scripted_folder: Path,
                                                                         tmp_path: Path) -> None:
    clips = tmp_path / "clips"
    clips.mkdir()
    _tone(clips / "good.wav")
    broken = clips / "broken.wav"
    broken.write_bytes(b"RIFF\x00\x00\x00\x00WAVEnot really")
    output = tmp_path / "out.jsonl"
    model = ["--model", str(scripted_folder)]
    first = _batch(str(clips), "-o", str(output), *model)
    assert first.exit_code == 1 and "1 failed" in first.output
    assert {row["id"]: row["error"] is None for row in _rows(output)} == {"broken.wav": False, "good.wav": True}

    again = _batch(str(clips), "-o", str(output), "--resume", *model)  # plain resume keeps the error row
    assert again.exit_code == 0 and "2 already done" in again.output and len(_rows(output)) == 2

    _tone(broken)  # the user fixes the file
    retried = _batch(str(clips), "-o", str(output), "--resume", "--retry-errors", *model)
    assert retried.exit_code == 0, retried.output
    rows = _rows(output)
    assert sorted(row["id"] for row in rows) == ["broken.wav", "good.wav"]
    assert all(row["error"] is None for row in rows)
    assert _batch(str(clips), "-o", str(output), "--retry-errors", *model).exit_code == 1  # needs --resume
    assert sorted(p.name for p in tmp_path.iterdir()) == ["clips", "out.jsonl"]  # no lock file left behind


@pytest.mark.slow
def test_kill_9_at_random_points_then_resume_gives_every_id_once(scripted_folder: Path, tmp_path: Path) -> None:
    """Ten runs killed at random moments (loading, mid-row, merging), each resumed; then a last resume."""
    import os
    import random
    import signal
    import time

    clips = tmp_path / "clips"
    clips.mkdir()
    for n in range(12):
        _tone(clips / f"clip{n:02d}.wav", seconds=0.5 + n / 10)
    output = tmp_path / "out.jsonl"
    command = [sys.executable, "-m", "asr", "batch", str(clips), "-o", str(output), "-q", "--model",
               str(scripted_folder), "--device", "cpu", "--threads", "1", "--batch-size", "2"]
    rng = random.Random(7)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    repo = Path(__file__).resolve().parents[1]
    for trial in range(10):
        process = subprocess.Popen(command + (["--resume"] if output.exists() else []), cwd=repo, env=env,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        time.sleep(rng.uniform(0.5, 6.0))
        process.send_signal(signal.SIGKILL)
        process.wait()
    final = subprocess.run(command + (["--resume"] if output.exists() else []), cwd=repo, env=env,
                           capture_output=True, text=True, timeout=600)
    assert final.returncode == 0, final.stderr[-2000:]
    data = output.read_text()
    assert data.endswith("\n")
    ids = [json.loads(line)["id"] for line in data.splitlines()]
    assert sorted(ids) == sorted(p.name for p in clips.iterdir())  # every id, each exactly once
