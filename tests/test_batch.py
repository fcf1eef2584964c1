"""`asr batch`: every source kind with bad items, resume after kill -9, batch sizes and assistants, two processes."""

from __future__ import annotations

import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from asr.batch.output import RowWriter, read_done_ids
from asr.batch.run import BatchOptions, BatchSummary, prepare_output, run_batch
from asr.batch.shards import (
    Processes,
    detect_processes,
    existing_parts,
    mark_done,
    merge_parts,
    part_path,
)
from asr.cli.batch import batch_command
from tests.conftest import REPO, SAMPLES, evaldata, free_port

GOOD = ["park.flac", "numbers.flac", "station.flac"]


def _clip_paths() -> dict[str, Path]:
    paths = {name: SAMPLES / name for name in GOOD}
    paths["english.wav"] = evaldata("clips", "english.wav")
    return paths


def _bad_files(folder: Path) -> None:
    (folder / "corrupt.flac").write_bytes(b"fLaC not really" + bytes(range(256)) * 8)
    (folder / "empty.wav").write_bytes(b"")


def _rows(path: Path) -> list[dict]:
    data = path.read_text(encoding="utf-8")
    assert data.endswith("\n"), "the file ends with a whole line"
    return [json.loads(line) for line in data.splitlines()]


def _texts(rows: list[dict]) -> dict[str, str | None]:
    return {row["id"]: row["text"] for row in rows}


# The command in a process of its own (kill -9, accelerate launch): `python -m asr batch`.
ASR_BATCH = ["-m", "asr", "batch"]


@pytest.fixture(scope="module")
def clips(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Four good clips and a corrupt one, in a folder (short clips: the encoder's 30 s window sets the cost)."""
    folder = tmp_path_factory.mktemp("clips")
    for name, path in _clip_paths().items():
        shutil.copy(path, folder / name)
    (folder / "corrupt.flac").write_bytes(b"fLaC not really" + bytes(range(256)) * 8)
    return folder


@pytest.fixture(scope="module")
def reference(base, clips: Path, tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    """Rows of an uninterrupted run at batch size 1 without an assistant: what every other run must give."""
    output = tmp_path_factory.mktemp("reference") / "results.jsonl"
    summary = run_batch(str(clips), output, base, batch=BatchOptions(progress=False))
    assert summary.written == 5 and summary.failed == 1
    return _rows(output)


def _check_against(rows: list[dict], reference: list[dict]) -> None:
    assert [r["id"] for r in rows] == [r["id"] for r in reference]
    assert _texts(rows) == _texts(reference)
    assert [r["error"] is None for r in rows] == [r["error"] is None for r in reference]


# Sources, each with bad items among good ones ------------------------------------------------------------------

@pytest.mark.slow
def test_reference_rows_hold_text_stats_and_one_error(reference: list[dict]) -> None:
    assert [r["id"] for r in reference] == sorted(r["id"] for r in reference)
    by_id = {r["id"]: r for r in reference}
    assert "corrupt.flac" in by_id["corrupt.flac"]["error"] and by_id["corrupt.flac"]["text"] is None
    assert "children" in by_id["park.flac"]["text"] and by_id["english.wav"]["text"].strip()
    for row in reference:
        assert set(row) == {"id", "audio", "text", "language", "stats", "error"}
        if row["error"] is None:
            assert row["language"] == "en" and row["stats"]["audio_seconds"] > 0


@pytest.mark.slow
def test_folder_source_gives_one_row_per_file(base, reference: list[dict], tmp_path: Path) -> None:
    folder = tmp_path / "audio"
    (folder / "sub").mkdir(parents=True)
    shutil.copy(SAMPLES / "station.flac", folder / "sub" / "station.flac")
    (folder / "sub" / "station.txt").write_text("the reference\n")
    (folder / "notes.txt").write_text("not audio")
    _bad_files(folder)
    output = tmp_path / "out" / "results.jsonl"
    run_batch(str(folder), output, base, batch=BatchOptions(progress=False, segments=True))
    rows = _rows(output)
    assert [r["id"] for r in rows] == ["corrupt.flac", "empty.wav", "sub/station.flac"]
    assert [r["error"] is None for r in rows] == [False, False, True]
    assert "empty" in rows[1]["error"] and "\n" not in rows[0]["error"]
    assert rows[2]["text"] == _texts(reference)["station.flac"] and rows[2]["reference"] == "the reference"
    assert "reference" not in rows[0] and rows[0]["segments"] is None
    assert rows[2]["segments"][0]["text"].strip() and rows[2]["segments"][-1]["end"] <= 5.0


@pytest.mark.slow
def test_jsonl_manifest_through_the_command(base, reference: list[dict], tmp_path: Path) -> None:
    for name in ("park.flac", "numbers.flac"):
        shutil.copy(SAMPLES / name, tmp_path / name)
    _bad_files(tmp_path)
    lines = [json.dumps({"audio": "park.flac", "text": "the park"}), json.dumps({"audio": "missing.wav"}),
             json.dumps({"audio": "corrupt.flac"}), "{not json", json.dumps({"id": "n", "audio": "numbers.flac"}),
             json.dumps({"audio": "empty.wav"}), json.dumps({"audio": "missing.wav"})]
    (tmp_path / "manifest.jsonl").write_text("\n".join(lines) + "\n")
    group = click.Group(commands=[batch_command])
    output = tmp_path / "results.jsonl"
    result = CliRunner().invoke(group, ["batch", str(tmp_path / "manifest.jsonl"), "-o", str(output), "-q",
                                        "--batch-size", "2", "--language", "en"])
    assert result.exit_code == 1, result.output  # items failed: the rows are written, the exit says so
    assert "7 item(s)" in result.stderr and "2 transcribed, 5 failed" in result.stderr and "RTF" in result.stderr
    rows = _rows(output)
    assert [r["id"] for r in rows] == ["park.flac", "missing.wav", "corrupt.flac", "manifest.jsonl:4", "n", "empty.wav",
                                     "missing.wav#2"]  # a repeated id is made unique: each row can be resumed
    assert [r["error"] is None for r in rows] == [True, False, False, False, True, False, False]
    assert "no such file" in rows[1]["error"] and "unreadable manifest line" in rows[3]["error"]
    assert rows[0]["text"] == _texts(reference)["park.flac"] and rows[0]["reference"] == "the park"
    assert rows[4]["text"] == _texts(reference)["numbers.flac"]
    # A second run without --resume refuses to touch the results; with --overwrite it starts again.
    again = CliRunner().invoke(group, ["batch", str(tmp_path / "manifest.jsonl"), "-o", str(output)])
    assert again.exit_code != 0 and "--resume" in again.output and "Traceback" not in again.output


@pytest.mark.slow
def test_csv_manifest(base, reference: list[dict], tmp_path: Path) -> None:
    shutil.copy(SAMPLES / "station.flac", tmp_path / "station.flac")
    _bad_files(tmp_path)
    with open(tmp_path / "list.csv", "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["id", "audio", "text"])
        writer.writerows([["a", "empty.wav", ""], ["b", "station.flac", "the station"], ["c", "nowhere.flac", ""],
                          ["d", "corrupt.flac", ""]])
    output = tmp_path / "results.jsonl"
    summary = run_batch(str(tmp_path / "list.csv"), output, base, batch=BatchOptions(progress=False, workers=0))
    rows = _rows(output)
    assert [r["id"] for r in rows] == ["a", "b", "c", "d"]
    assert [r["error"] is None for r in rows] == [False, True, False, False]
    assert rows[1]["text"] == _texts(reference)["station.flac"] and rows[1]["reference"] == "the station"
    assert (summary.written, summary.failed) == (4, 3)


@pytest.mark.slow
def test_saved_dataset(base, reference: list[dict], tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    _bad_files(tmp_path)
    shutil.copy(SAMPLES / "numbers.flac", tmp_path / "numbers.flac")
    files = [str(tmp_path / n) for n in ("numbers.flac", "corrupt.flac", "empty.wav")]
    data = datasets.Dataset.from_dict({"id": ["numbers.flac", "corrupt", "empty"], "audio": files,
                                       "sentence": ["twenty three", "", ""]})
    data = data.cast_column("audio", datasets.Audio())
    datasets.concatenate_datasets([data, datasets.Dataset.from_dict(
        {"id": ["none"], "audio": [None], "sentence": [""]}).cast_column("audio", datasets.Audio())]
    ).save_to_disk(str(tmp_path / "saved"))
    output = tmp_path / "results.jsonl"
    run_batch(str(tmp_path / "saved"), output, base,
              batch=BatchOptions(progress=False, text_column="sentence", batch_size=4))
    rows = _rows(output)
    assert [r["id"] for r in rows] == ["numbers.flac", "corrupt", "empty", "none"]
    assert [r["error"] is None for r in rows] == [True, False, False, False]
    assert rows[0]["text"] == _texts(reference)["numbers.flac"] and rows[0]["reference"] == "twenty three"


# Kill -9 and resume ------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_killed_run_resumes_to_every_item_exactly_once(base, clips: Path, reference: list[dict], tmp_path: Path) -> None:
    output = tmp_path / "results.jsonl"
    process = subprocess.Popen([sys.executable, *ASR_BATCH, str(clips), "-o", str(output), "-q", "--workers", "1"],
                               cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and process.poll() is None:
        if output.exists() and output.read_bytes().count(b"\n") >= 2:
            break
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    stderr = process.communicate()[1].decode()
    assert output.exists(), stderr
    before = len(read_done_ids(output))
    assert 2 <= before < len(reference), "the kill landed part-way"
    # As if the kill had come in the middle of a write: half a row at the end.
    with open(output, "ab") as handle:
        handle.write(b'{"id": "station.flac", "audio": "st')

    summary = run_batch(str(clips), output, base, batch=BatchOptions(progress=False, resume=True, batch_size=2))
    rows = _rows(output)
    assert summary.skipped == before and summary.written == len(reference) - before
    _check_against(rows, reference)
    # Resuming a finished run does nothing.
    assert run_batch(str(clips), output, base, batch=BatchOptions(progress=False, resume=True)).written == 0
    assert _rows(output) == rows


def test_repair_cuts_a_partial_line_and_drops_garbage(tmp_path: Path) -> None:
    path = tmp_path / "results.jsonl"
    path.write_bytes(b'{"id": "a", "text": "x"}\n{"id": "b", "text": "y"}\n{"id": "c", "te')
    assert read_done_ids(path) == {"a", "b"} and path.read_bytes().endswith(b'"te')  # reading alone changes nothing
    assert read_done_ids(path, repair=True) == {"a", "b"}
    assert path.read_bytes() == b'{"id": "a", "text": "x"}\n{"id": "b", "text": "y"}\n'
    path.write_bytes(b'{"id": "a"}\n\x00\x00garbage\n{"id": "b"}\n')
    assert read_done_ids(path, repair=True) == {"a", "b"}
    assert path.read_bytes() == b'{"id": "a"}\n{"id": "b"}\n'


def test_a_second_writer_on_the_same_file_is_refused(tmp_path: Path) -> None:
    with RowWriter(tmp_path / "results.jsonl") as writer:
        writer.write({"id": "a"})
        with pytest.raises(ValueError, match="another run"):
            RowWriter(tmp_path / "results.jsonl")
    with RowWriter(tmp_path / "results.jsonl") as writer:  # free again once closed
        assert writer.resume() == {"a"}


def test_merge_keeps_input_order_and_each_id_once(tmp_path: Path) -> None:
    output = tmp_path / "results.jsonl"
    output.write_text('{"id": "b", "n": 1}\n{"id": "gone", "n": 1}\n')
    part_path(output, 0, 2).write_text('{"id": "a"}\n{"id": "c"}\n')
    part_path(output, 1, 2).write_text('{"id": "b", "n": 2}\n{"id": "d"}\n{"id": "e"')  # killed mid-write
    mark_done(part_path(output, 0, 2), {})
    (tmp_path / "results.jsonl.merging").write_text("left by a killed merge")
    assert merge_parts(output, ["a", "b", "c", "d", "e"]) == 5
    assert [json.loads(line) for line in output.read_text().splitlines()] == [
        {"id": "a"}, {"id": "b", "n": 1}, {"id": "c"}, {"id": "d"}, {"id": "gone", "n": 1}]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.jsonl"]


# Batch sizes and assistants: the same words --------------------------------------------------------------------

@pytest.fixture(scope="module")
def int8_assistant(base):
    from asr.assist.choose import make_assistant

    return make_assistant("self:int8", base)


@pytest.mark.slow
@pytest.mark.parametrize("batch_size,assisted", [(4, False), (8, False), (1, True), (4, True), (8, True)])
def test_batch_sizes_and_assistant_give_the_same_texts(base, int8_assistant, clips: Path, reference: list[dict],
                                                       tmp_path: Path, batch_size: int, assisted: bool) -> None:
    output = tmp_path / "results.jsonl"
    run_batch(str(clips), output, base, int8_assistant if assisted else None,
              batch=BatchOptions(progress=False, batch_size=batch_size))
    rows = _rows(output)
    _check_against(rows, reference)
    drafted = [r["stats"]["drafted_tokens"] for r in rows if r["error"] is None]
    assert all(d > 0 for d in drafted) if assisted else not any(drafted)


# Several processes -----------------------------------------------------------------------------------------------

def test_round_robin_shares_and_process_detection(monkeypatch: pytest.MonkeyPatch) -> None:
    shares = [[i for i in range(7) if Processes(k, 3).owns(i)] for k in range(3)]
    assert shares == [[0, 3, 6], [1, 4], [2, 5]]
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    assert detect_processes() == Processes()
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert detect_processes() == Processes(3, 4, 1, 2)


def test_existing_results_need_resume_or_overwrite(tmp_path: Path) -> None:
    output = tmp_path / "results.jsonl"
    part = part_path(output, 1, 2)
    part.write_text('{"id": "x"}\n')
    with pytest.raises(ValueError, match="--resume"):
        prepare_output(output, BatchOptions())
    prepare_output(output, BatchOptions(resume=True))
    assert part.exists()
    prepare_output(output, BatchOptions(overwrite=True))
    assert existing_parts(output) == []
    with pytest.raises(ValueError, match="either"):
        BatchOptions(resume=True, overwrite=True)


@pytest.mark.slow
def test_resume_merges_parts_of_an_earlier_multi_process_run(base, clips: Path, reference: list[dict],
                                                             tmp_path: Path) -> None:
    """Parts of a killed 2-process run, one with a half-written line, resumed by one process: one file, in order."""
    output = tmp_path / "results.jsonl"
    lines = [json.dumps(row) + "\n" for row in reference]
    part_path(output, 0, 2).write_text(lines[0] + lines[2])
    part_path(output, 1, 2).write_text(lines[1] + lines[3] + lines[4][:20])
    summary = run_batch(str(clips), output, base, batch=BatchOptions(progress=False, resume=True))
    assert (summary.skipped, summary.written, summary.rows_in_file) == (4, 1, 5)
    _check_against(_rows(output), reference)
    assert existing_parts(output) == [] and sorted(p.name for p in tmp_path.iterdir()) == ["results.jsonl"]


@pytest.mark.slow
def test_two_processes_under_accelerate_merge_into_one_file(base, clips: Path, reference: list[dict],
                                                            tmp_path: Path) -> None:
    pytest.importorskip("accelerate")
    output = tmp_path / "results.jsonl"
    # `--multi_gpu` is accelerate's torchrun launcher: on a machine without GPUs it starts CPU processes.
    # (`--cpu --num_processes 2` starts one process unless an MPI hostfile is given.)
    command = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
               "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
               "--main_process_port", str(free_port()), *ASR_BATCH, str(clips), "-o", str(output), "-q",
               "--batch-size", "2"]
    result = subprocess.run(command, check=False, cwd=REPO, capture_output=True, text=True, timeout=600,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    if result.returncode != 0 and any(s in result.stderr for s in ("DistNetworkError", "RendezvousConnectionError")):
        pytest.skip(f"accelerate cannot start a process group here: {result.stderr.strip().splitlines()[-1]}")
    assert result.returncode == 1, result.stderr[-3000:]  # corrupt.flac failed
    assert "(2 processes)" in result.stderr and "5 row(s) in the file" in result.stderr
    _check_against(_rows(output), reference)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.jsonl"]


def test_summary_line() -> None:
    summary = BatchSummary(written=10, failed=2, skipped=3, audio_seconds=7200.0, wall_seconds=360.0, processes=2)
    line = summary.describe("out.jsonl")
    assert "8 transcribed, 2 failed, 3 already done" in line and "2.00 h" in line and "RTF 0.050" in line
