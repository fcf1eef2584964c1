"""`asr eval --hypotheses`: stored transcripts (an `asr batch` run, other systems' JSONL or CSV, a folder of .txt)
scored beside decoded configurations, matched by id, every unusable row counted; and the paired bootstrap
interval of each configuration's WER difference."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from asr.cli import main
from eval.bootstrap import paired_interval
from eval.hypotheses import read_hypotheses
from eval.normalize import normalize
from tests.conftest import SAMPLES, free_port

SOURCE = str(SAMPLES / "manifest.jsonl")
TEXTS = {"park.flac": "The sun was shining and the children were playing in the park.",
         "numbers.flac": "She bought twenty three apples and seven oranges for nine dollars.",
         "station.flac": "We walked to the station and waited for the last train home."}


def _eval(tmp_path: Path, *arguments: str) -> dict:
    result = CliRunner().invoke(main, ["eval", SOURCE, "--report", str(tmp_path / "report"), "-q", *arguments])
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    report["output"] = result.output
    return report


def _config(report: dict, name: str) -> dict:
    return next(c for c in report["configurations"] if c["name"] == name)


def test_an_asr_batch_run_scores_the_wer_eval_computes_decoding(tmp_path: Path, scripted_folder: Path) -> None:
    rows = tmp_path / "batch.jsonl"
    batch = CliRunner().invoke(main, ["batch", SOURCE, "-o", str(rows), "--model", str(scripted_folder),
                                      "--assistant", "none", "-q"])
    assert batch.exit_code == 0, batch.output
    report = _eval(tmp_path, "--model", str(scripted_folder), "--compare", "greedy", "--hypotheses",
                   f"{rows}:last-week")
    decoded, stored = _config(report, "greedy"), _config(report, "last-week")
    assert stored["wer"] == decoded["wer"] and stored["wer"] > 0
    assert stored["exact_match_rate"] == 1.0 and stored["wer_difference"] == 0.0
    assert stored["wer_difference_ci"] == [0.0, 0.0]
    assert stored["total_seconds"] is None and stored["speedup"] is None  # stored: no time
    assert "WER - reference's" in (tmp_path / "report" / "report.md").read_text()


def test_other_systems_outputs_score_without_a_model(tmp_path: Path) -> None:
    """faster-whisper's outputs as JSONL, a CSV, a folder of .txt: no --compare, so nothing is decoded."""
    jsonl = tmp_path / "faster-whisper.jsonl"
    jsonl.write_text("".join(json.dumps({"id": name, "text": text}) + "\n" for name, text in TEXTS.items()))
    csv = tmp_path / "api.csv"
    csv.write_text("key,transcript\npark,the sun was shining\nnumbers.flac,\"She bought 23 apples, 7 oranges.\"\n"
                   "station.flac,We walked to the station and waited for the last train home.\n")
    folder = tmp_path / "txt"
    folder.mkdir()
    for name, text in TEXTS.items():
        (folder / name).with_suffix(".txt").write_text(text.upper())
    report = _eval(tmp_path, "--hypotheses", str(jsonl), "--hypotheses", str(csv), "--hypotheses", f"{folder}:upper")
    assert _config(report, "faster-whisper")["wer"] == 0.0
    assert _config(report, "upper")["wer"] == 0.0  # the English normaliser: case does not count
    api = _config(report, "api")
    assert api["wer"] > 0 and api["deletions"] >= 7  # "the sun was shining" and nothing more
    low, high = api["wer_difference_ci"]
    assert low <= api["wer_difference"] <= high
    assert report["run"]["configurations"] == ["faster-whisper", "api", "upper"]
    assert all(row["normalizer"] == "whisper-english, words" for row in api["items"])


def test_bad_rows_are_counted_one_line_each(tmp_path: Path) -> None:
    jsonl = tmp_path / "messy.jsonl"
    jsonl.write_text("\n".join([json.dumps({"id": "park.flac", "text": TEXTS["park.flac"]}),
                                json.dumps({"id": "park.flac", "text": "again"}),
                                json.dumps({"id": "numbers.flac", "text": ""}),
                                json.dumps({"id": "elsewhere.wav", "text": "hello"}),
                                json.dumps({"text": "no id"}),
                                "{not json"]) + "\n")
    report = _eval(tmp_path, "--hypotheses", str(jsonl))
    source = report["hypotheses"][0]
    assert source["duplicate_ids"] == ["park.flac"] and source["empty_texts"] == ["numbers.flac"]
    assert source["unmatched_ids"] == ["elsewhere.wav"] and source["missing_items"] == ["station.flac"]
    assert len(source["unreadable_rows"]) == 2
    messy = _config(report, "messy")
    assert [f["id"] for f in messy["items_failed"]] == ["station.flac"]
    assert messy["deletions"] == len(normalize(TEXTS["numbers.flac"]).split())  # an empty text deletes every word
    for what in ("repeated id", "empty text", "match no item", "without a hypothesis", "without an id"):
        assert sum(what in line for line in report["output"].splitlines()) == 1, (what, report["output"])


@pytest.mark.parametrize("content, name, message", [
    ("a,b\n1,2\n", "x.csv", "names no id column"),
    ("id,text\n", "empty.csv", "no hypothesis"),
    ("hello", "x.txt", "not a JSONL, CSV"),
    ("not json\n", "x.jsonl", "line 1 is not JSON"),
])
def test_a_file_of_another_format_is_one_line(tmp_path: Path, content: str, name: str, message: str) -> None:
    path = tmp_path / name
    path.write_text(content)
    result = CliRunner().invoke(main, ["eval", SOURCE, "--report", str(tmp_path / "r"), "--hypotheses", str(path)])
    assert result.exit_code == 1 and message in result.output, result.output
    with pytest.raises(ValueError, match=message):
        read_hypotheses(str(path))


def test_paired_bootstrap_interval() -> None:
    words = [10] * 50
    same = paired_interval([1] * 50, [1] * 50, words)
    assert same == (0.0, 0.0)
    worse = paired_interval([1] * 50, [2] * 25 + [1] * 25, words)
    assert 0 < worse[0] < 0.05 < worse[1] < 0.08  # +0.05 on average, always above 0
    noisy = paired_interval([0, 3] * 25, [3, 0] * 25, words)
    assert noisy[0] < 0 < noisy[1]
    assert paired_interval([1], [2], [10]) is None


def _manifest(tmp_path: Path, copies: int) -> Path:
    """The three samples under `copies` distinct ids each, one of them unreadable."""
    lines = [json.dumps({"id": f"{name}-{k}", "audio": str(SAMPLES / name), "text": text})
             for k in range(copies) for name, text in TEXTS.items()]
    lines.insert(4, json.dumps({"id": "gone", "audio": str(tmp_path / "missing.flac"), "text": "nothing"}))
    path = tmp_path / "manifest.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def _figures(report_dir: Path) -> tuple:
    report = json.loads((report_dir / "report.json").read_text())
    config = report["configurations"][0]
    rows = [(r["id"], r["hypothesis"], r["wer"], r["error"]) for r in config["items"]]
    return config["wer"], config["items_decoded"], report["items_total"], rows


def test_a_killed_run_resumes_to_the_same_report(tmp_path: Path, scripted_folder: Path) -> None:
    """kill -9 in the middle, then --resume: the report of one uninterrupted run, nothing decoded twice."""
    import os
    import signal
    import subprocess
    import sys
    import time

    manifest = _manifest(tmp_path, copies=20)
    command = [sys.executable, "-m", "asr", "eval", str(manifest), "--model", str(scripted_folder), "--compare",
               "greedy", "--threads", "1", "-q"]
    whole = subprocess.run([*command, "--report", str(tmp_path / "whole")], capture_output=True, text=True)
    assert whole.returncode == 0, whole.stderr
    killed = tmp_path / "killed"
    process = subprocess.Popen([*command, "--report", str(killed)], stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not (killed / "items.jsonl").exists() or len((killed / "items.jsonl").read_text().splitlines()) < 12:
        assert process.poll() is None and time.monotonic() < deadline, "the run ended before it could be killed"
        time.sleep(0.05)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    assert not (killed / "report.json").exists()
    before = len((killed / "items.jsonl").read_text().splitlines())
    resumed = subprocess.run([*command, "--report", str(killed), "--resume"], capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr
    import re

    found = re.search(r"resumed: (\d+) item\(s\) from .*, (\d+) decoded now", resumed.stderr)
    taken, decoded = map(int, found.groups())
    assert taken >= before - 1 and taken + decoded == 61  # one row per item: all but a cut one taken, none twice
    assert _figures(killed) == _figures(tmp_path / "whole")
    ids = [json.loads(line)["id"] for line in (killed / "items.jsonl").read_text().splitlines()]
    assert len(ids) == len(set(ids)) == 61  # every item once (the final file is the report's)


def test_resume_refuses_another_runs_configurations(tmp_path: Path, scripted_folder: Path) -> None:
    manifest = _manifest(tmp_path, copies=1)
    arguments = ["eval", str(manifest), "--model", str(scripted_folder), "--report", str(tmp_path / "r"), "-q"]
    assert CliRunner().invoke(main, [*arguments, "--compare", "greedy"]).exit_code == 0
    result = CliRunner().invoke(main, [*arguments, "--compare", "assisted:self:int8", "--resume"])
    assert result.exit_code == 1 and "resume it with the same" in result.output, result.output


def test_batched_evaluation_times_each_configuration_as_a_whole(tmp_path: Path, scripted_folder: Path) -> None:
    manifest = _manifest(tmp_path, copies=4)
    arguments = ["eval", str(manifest), "--model", str(scripted_folder), "--compare", "greedy", "-q"]
    for size in (1, 8):
        result = CliRunner().invoke(main, [*arguments, "--batch-size", str(size),
                                           "--report", str(tmp_path / str(size))])
        assert result.exit_code == 0, result.output
    one, eight = (json.loads((tmp_path / name / "report.json").read_text()) for name in ("1", "8"))
    assert eight["batch_size"] == 8 and "8 items decoded together" in (tmp_path / "8" / "report.md").read_text()
    assert _figures(tmp_path / "8")[:3] == _figures(tmp_path / "1")[:3]  # the same WER, items and failures
    config = eight["configurations"][0]
    assert config["total_seconds"] > 0 and config["rtfx"] > 0 and config["median_seconds"] is None
    assert all(row["seconds"] is None for row in config["items"])
    assert [r["hypothesis"] for r in config["items"]] == [r["hypothesis"] for r in one["configurations"][0]["items"]]


def test_two_processes_under_accelerate_write_one_report(tmp_path: Path, scripted_folder: Path) -> None:
    """`accelerate launch --num_processes 2 -m asr eval`: one merged report, every item once, the words and WER
    of one process's run."""
    import os
    import subprocess
    import sys

    pytest.importorskip("accelerate")
    manifest = _manifest(tmp_path, copies=3)
    arguments = ["-m", "asr", "eval", str(manifest), "--model", str(scripted_folder), "--compare", "greedy", "-q"]
    alone = subprocess.run([sys.executable, *arguments, "--report", str(tmp_path / "one")], capture_output=True,
                           text=True)
    assert alone.returncode == 0, alone.stderr
    port = free_port()
    result = subprocess.run([sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
                             "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
                             "--main_process_port", str(port), *arguments, "--report", str(tmp_path / "two")],
                            capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    if result.returncode != 0 and any(s in result.stderr for s in ("DistNetworkError", "RendezvousConnectionError")):
        pytest.skip(f"accelerate cannot start a process group here: {result.stderr.strip().splitlines()[-1]}")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "merged the shares of 2 processes" in result.stderr
    assert _figures(tmp_path / "two") == _figures(tmp_path / "one")
    assert sorted(p.name for p in (tmp_path / "two").iterdir() if "items" in p.name) == ["items.jsonl"]
