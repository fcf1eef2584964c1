"""A distilled draft's rounds chosen from step costs (`asr.assist.rounds`): the cost model on made-up costs, and the
measurement once per pair on a tiny model."""

from __future__ import annotations

from pathlib import Path

import pytest

from asr.assist.rounds import StepCosts, best_rounds, expected_speedup


def test_a_check_as_cheap_as_a_step_drafts_longer_rounds_than_a_costly_one() -> None:
    cheap = StepCosts(model=(0.010, 0.0101, 0.0102, 0.0103, 0.0104, 0.0105), draft=0.001)
    costly = StepCosts(model=(0.010, 0.0125, 0.015, 0.0175, 0.020, 0.0225), draft=0.002)
    assert best_rounds(cheap, 0.7)[1] >= 3
    assert best_rounds(costly, 0.7) == ("constant", 1)
    assert best_rounds(cheap, 0.7)[0] == "constant"


def test_the_speedup_is_the_design_cost_model_when_a_check_costs_a_step() -> None:
    a, k, c = 0.6, 3, 0.2
    costs = StepCosts(model=(1.0,) * 6, draft=c)
    assert expected_speedup(costs, k, a) == pytest.approx((1 - a ** (k + 1)) / ((1 - a) * (k * c + 1)))
    # A draft that always agrees: k + 1 tokens a round.
    assert expected_speedup(costs, k, 1.0) == pytest.approx((k + 1) / (k * c + 1))


def test_only_rounds_whose_check_was_measured_are_chosen() -> None:
    free = StepCosts(model=(1.0, 1.0, 1.0), draft=0.0)
    assert best_rounds(free, 0.99) == ("constant", 2)
    with pytest.raises(ValueError, match="at least 2 tokens"):
        best_rounds(StepCosts(model=(1.0,), draft=0.1))


def test_a_pair_is_measured_once_and_logged(tiny_whisper_folder: Path, tmp_path: Path, monkeypatch, caplog) -> None:
    from asr.assist import rounds
    from asr.assist.choose import make_assistant
    from asr.assist.draft_model import DraftDecoder, save_draft
    from asr.models.registry import load_model

    bundle = load_model(str(tiny_whisper_folder))
    save_draft(DraftDecoder(bundle.model, [1]), bundle.model, tmp_path / "draft", model_name="tiny", training={})
    with caplog.at_level("INFO", logger="asr.assist.rounds"):
        assistant = make_assistant(str(tmp_path / "draft"), bundle)
    assert "draft rounds: model pass" in caplog.text and "constant rounds of" in caplog.text
    measured = []
    monkeypatch.setattr(rounds, "measure_costs", lambda *args: measured.append(args) or StepCosts((1.0, 1.0), 0.1))
    again, _ = rounds.measured_rounds(bundle, assistant.decoder_model, assistant.dtype)
    assert again == assistant.schedule and measured == []  # kept for this (model, draft)
