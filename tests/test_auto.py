"""`--assistant auto`, the default: a shipped draft model where its measured costs expect a gain, plain decoding
where they do not, where beams or batches of windows decode, and where the draft cannot be had (one warning);
the assistant that ran named in the statistics."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from asr.cli import main
from tests.conftest import SAMPLES

CLIP = str(SAMPLES / "numbers.flac")


@pytest.fixture()
def shipped(tiny_whisper_folder: Path, tmp_path: Path, monkeypatch):
    """A shipped-drafts folder holding `tiny-draft`, a (random) draft model for the tiny Whisper, with its
    held-out agreement in its report; the step costs are made to favour drafting unless a test says otherwise."""
    import asr.assist.choose
    from asr.assist import rounds
    from asr.assist.draft_model import DraftDecoder, save_draft
    from asr.models.registry import load_model

    bundle = load_model(str(tiny_whisper_folder))
    folder = tmp_path / "drafts"
    save_draft(DraftDecoder(bundle.model, [1]), bundle.model, folder / "tiny-draft", model_name="tiny",
               training={"agreement": 0.85})
    monkeypatch.setattr(asr.assist.choose, "DRAFTS_DIR", folder)
    monkeypatch.setattr(rounds, "measure_costs", lambda *args, **kwargs: rounds.StepCosts((10.0, 10.5, 11.0), 1.0))
    return folder / "tiny-draft"


def test_auto_drafts_with_the_shipped_draft_where_its_measured_costs_expect_a_gain(tiny_whisper_folder, shipped,
                                                                                   monkeypatch, caplog) -> None:
    from asr.assist import rounds
    from asr.assist.choose import AUTO_MIN_SPEEDUP, draft_acceptance, make_assistant
    from asr.models.registry import load_model

    assert draft_acceptance(shipped) == 0.85  # the draft's own held-out agreement, not a constant
    chosen = make_assistant("auto", load_model(str(tiny_whisper_folder)))
    assert chosen.name == "tiny-draft:int8" and chosen.chosen_by_auto
    assert chosen.expected_speedup >= AUTO_MIN_SPEEDUP and chosen.schedule[0] == "constant"
    assert make_assistant("tiny-draft:int8", load_model(str(tiny_whisper_folder))).chosen_by_auto is False

    # A model step hardly dearer than a draft step: drafting would lose, so auto decodes alone (and says why).
    monkeypatch.setattr(rounds, "measure_costs", lambda *args, **kwargs: rounds.StepCosts((1.0, 1.9, 2.8), 0.9))
    with caplog.at_level("INFO", logger="asr.assist.choose"):
        assert make_assistant("auto", load_model(str(tiny_whisper_folder))) is None
    assert "tiny-draft:int8 expects 0." in caplog.text and "decoding without an assistant" in caplog.text


def test_a_damaged_or_future_shipped_draft_is_one_warning_and_plain_decoding(tiny_whisper_folder, shipped) -> None:
    args = ["transcribe", CLIP, "--model", str(tiny_whisper_folder), "--language", "en", "--threads", "1",
            "-f", "json"]
    plain = CliRunner().invoke(main, [*args, "--assistant", "none", "-q"])
    assert plain.exit_code == 0, plain.output
    description = json.loads((shipped / "draft.json").read_text())
    weights = (shipped / "model.safetensors").read_bytes()
    for damage, words in (("weights", "cannot read draft weights"), ("version", "draft format version 99")):
        if damage == "weights":
            (shipped / "model.safetensors").write_bytes(weights[:100])
        else:
            (shipped / "model.safetensors").write_bytes(weights)
            (shipped / "draft.json").write_text(json.dumps({**description, "version": 99}))
        result = CliRunner().invoke(main, args)  # --assistant auto: the default
        assert result.exit_code == 0, result.output
        # (the random model's window also fails the fallback checks: that warning is not the draft's)
        warnings = [line for line in result.stderr.splitlines() if line.startswith("warning: --assistant")]
        assert len(warnings) == 1 and words in warnings[0] and "tiny-draft" in warnings[0], result.stderr
        assert json.loads(result.stdout)["text"] == json.loads(plain.stdout)["text"]
        assert json.loads(result.stdout)["stats"]["assistant"] == "none"
        named = CliRunner().invoke(main, [*args, "--assistant", str(shipped)])  # asked for by name: an error
        assert named.exit_code == 1 and words in named.output and "Traceback" not in named.output


def test_a_shipped_draft_for_another_model_is_passed_over_silently(other_tiny_folder, shipped, caplog) -> None:
    from asr.assist.choose import make_assistant
    from asr.models.registry import load_model

    other = load_model(str(other_tiny_folder))
    with caplog.at_level("WARNING"):
        assert make_assistant("auto", other) is None
    assert caplog.text == ""
    with pytest.raises(ValueError, match="was trained for model 'tiny'"):
        make_assistant(str(shipped), other)


def test_what_auto_chose_drafts_neither_beams_nor_batches_of_windows(tiny_whisper_folder, shipped) -> None:
    from asr.assist.choose import make_assistant
    from asr.models.registry import load_model
    from asr.options import TranscribeOptions
    from asr.transcription import Transcriber, transcribe

    bundle = load_model(str(tiny_whisper_folder))
    chosen = make_assistant("auto", bundle)
    options = TranscribeOptions(language="en", temperatures=(0.0,))
    alone = transcribe(bundle, CLIP, options, chosen)
    assert alone.stats.assistant == "tiny-draft:int8" and alone.stats.generation.drafted_tokens > 0
    beams = transcribe(bundle, CLIP, TranscribeOptions(language="en", temperatures=(0.0,), beam_size=2), chosen)
    assert beams.stats.assistant == "none"
    many = Transcriber(bundle, options, chosen).transcribe_many([CLIP, CLIP], batch_size=2)
    assert [t.stats.assistant for t in many] == ["none", "none"] and many[0].text == alone.text
    assert [t.stats.generation.drafted_tokens for t in many] == [0, 0]
    named = make_assistant("tiny-draft:int8", bundle)  # asked for by name: it drafts in batches too
    assert Transcriber(bundle, options, named).transcribe_many([CLIP, CLIP], 2)[0].stats.assistant == "tiny-draft:int8"
    with pytest.raises(ValueError, match="alone"):
        transcribe(bundle, CLIP, TranscribeOptions(beam_size=2), named)


def test_a_live_stream_leaves_out_the_shipped_draft_auto_chose(tiny_whisper_folder, shipped) -> None:
    from asr.assist.choose import make_assistant
    from asr.live import StreamingTranscriber
    from asr.models.registry import load_model

    bundle = load_model(str(tiny_whisper_folder))
    chosen = make_assistant("auto", bundle)
    assert chosen.name == "tiny-draft:int8" and chosen.for_streams is False
    assert StreamingTranscriber(bundle, assistant=chosen).assistant is None  # the last hypothesis drafts alone
    named = make_assistant("tiny-draft:int8", bundle)  # asked for by name: it drafts the new audio
    assert named.for_streams and StreamingTranscriber(bundle, assistant=named).assistant is named


def test_the_json_statistics_name_the_assistant_that_ran(tiny_whisper_folder: Path) -> None:
    args = ["transcribe", CLIP, "--model", str(tiny_whisper_folder), "--language", "en", "--threads", "1",
            "-f", "json", "-q"]
    for assistant, name in (("self:int8", "self:int8"), ("none", "none"), ("auto", "none")):
        result = CliRunner().invoke(main, [*args, "--assistant", assistant])
        assert result.exit_code == 0, result.output
        assert json.loads(result.stdout)["stats"]["assistant"] == name


def test_the_default_assistant_is_auto_everywhere() -> None:
    import inspect

    from asr import load_pair
    from asr.cli.options import SHARED
    from eval.configs import parse_config

    assert inspect.signature(load_pair).parameters["assistant"].default == "auto"
    options = [decorate(lambda: None) for decorate in SHARED]
    assistant = [p for f in options for p in f.__click_params__ if p.name == "assistant"]
    assert [p.default for p in assistant] == ["auto"]
    assert parse_config("assisted").assistant == "auto"


def test_auto_decodes_an_int8_model_alone(tiny_whisper_folder: Path, shipped) -> None:
    from asr.assist.choose import make_assistant
    from asr.models.precision import INT8, is_int8_model
    from asr.models.registry import load_model

    int8 = load_model(str(tiny_whisper_folder), dtype=INT8)
    assert is_int8_model(int8.model) and not is_int8_model(load_model(str(tiny_whisper_folder)).model)
    # Even where the costs measured at load would expect a gain (the fixture's): the matrix found it slower.
    assert make_assistant("auto", int8, dtype=INT8) is None
    assert make_assistant("tiny-draft:int8", int8, dtype=INT8) is not None  # asked for by name, it drafts
