"""Whisper's logit rules (`asr.whisper.logit_rules`), on a toy vocabulary: the masks `SuppressAtBegin` and `TimestampRules`
apply, one position at a time and over several drafted positions at once."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from asr.whisper.logit_rules import SuppressAtBegin, TimestampRules, whisper_filters
from decoding.filters import SuppressTokens

# A toy vocabulary of 20: text 0-4, end-of-text 5, no-timestamps 6, other specials 7-9, timestamps 10-19.
V, EOT, NO_TIMESTAMPS, TS = 20, 5, 6, 10
PROMPT = [7, 8, 9]  # the start-of-transcript sequence: sampling begins at position 3
TEXT_LOGIT = 10.0  # text far above the timestamps, so the timestamp-mass rule stays out of the way


def rules(max_initial: int | None = 2) -> TimestampRules:
    return TimestampRules(sample_begin=len(PROMPT), eot=EOT, no_timestamps=NO_TIMESTAMPS, timestamp_begin=TS,
                          max_initial_timestamp_index=max_initial)


def allowed(rule, sampled: list[int], logits: torch.Tensor | None = None) -> list[int]:
    """The tokens left possible for the position after PROMPT + sampled."""
    if logits is None:
        logits = torch.zeros(V)
        logits[:TS] = TEXT_LOGIT
    out = rule.apply(torch.tensor([PROMPT + sampled]), logits.clone()[None, None])
    return torch.nonzero(out[0, 0] > -torch.inf).flatten().tolist()


TEXT_AND_SPECIALS = [0, 1, 2, 3, 4, 5, 7, 8, 9]  # everything but no-timestamps below the timestamps


def test_the_first_token_is_a_timestamp_no_later_than_the_initial_bound() -> None:
    assert allowed(rules(max_initial=2), []) == [10, 11, 12]
    assert allowed(rules(max_initial=0), []) == [10]
    assert allowed(rules(max_initial=None), []) == list(range(TS, V))


def test_text_follows_an_opening_timestamp() -> None:
    # One timestamp counts as a pair with the start: the next token is text (or end-of-text).
    assert allowed(rules(), [12]) == TEXT_AND_SPECIALS


def test_after_text_timestamps_may_not_go_back() -> None:
    # After <12> text, a timestamp must be later than 12: 13 on (the segment has non-zero length).
    assert allowed(rules(), [12, 4]) == TEXT_AND_SPECIALS + list(range(13, V))


def test_a_closing_timestamp_is_followed_by_an_opening_one_or_the_end() -> None:
    # <12> text <14>: text is forbidden; the next segment opens at 14 or later, or the window ends.
    assert allowed(rules(), [12, 4, 14]) == [EOT, 7, 8, 9] + list(range(14, V))


def test_a_pair_of_timestamps_is_followed_by_text() -> None:
    assert allowed(rules(), [12, 4, 14, 14]) == TEXT_AND_SPECIALS
    assert allowed(rules(), [12, 4, 14, 15, 2]) == TEXT_AND_SPECIALS + list(range(16, V))


def test_no_timestamps_is_never_sampled() -> None:
    for sampled in ([], [12], [12, 4], [12, 4, 14], [12, 4, 14, 14]):
        assert NO_TIMESTAMPS not in allowed(rules(max_initial=None), sampled)


def test_timestamps_win_when_their_total_outweighs_every_text_token() -> None:
    logits = torch.zeros(V)
    logits[:TS] = 4.0
    logits[TS:] = 3.0  # 7 allowed timestamps after <12> text: log(7 e^3) = 4.95 > 4
    assert allowed(rules(), [12, 4], logits) == list(range(13, V))
    logits[TS:] = 2.0  # log(7 e^2) = 3.95 < 4: text stays possible
    logits[TS:13] = 50.0  # forbidden timestamps (not after 12) do not count
    assert allowed(rules(), [12, 4], logits) == TEXT_AND_SPECIALS + list(range(13, V))
    # One strong text token is enough to keep text.
    logits[2] = 6.0
    logits[TS:] = 3.0
    assert allowed(rules(), [12, 4], logits) == TEXT_AND_SPECIALS + list(range(13, V))


@pytest.mark.parametrize("seed", range(6))
def test_several_drafted_positions_get_the_masks_of_one_position_each(seed: int) -> None:
    """Row j of a check over drafts gets exactly the mask it would get on its own (the rules are per position)."""
    g = torch.Generator().manual_seed(seed)
    sampled = [12, 4, 1, 14, 14, 3, 17, 17][: 4 + seed % 5]
    positions = min(len(sampled) + 1, 2 + seed)
    logits = torch.randn(1, positions, V, generator=g) * 3
    together = rules().apply(torch.tensor([PROMPT + sampled]), logits.clone())
    for j in range(positions):
        context = PROMPT + sampled[: len(sampled) - positions + 1 + j]
        alone = rules().apply(torch.tensor([context]), logits[:, j:j + 1].clone())
        assert torch.equal(together[0, j], alone[0, 0]), f"row {j}"


def test_suppress_at_begin_masks_only_the_row_of_the_first_sampled_position() -> None:
    tokens = torch.tensor([PROMPT + [12, 4]])  # 5 tokens, 3 rows: they predict positions 3, 4 and 5
    for sample_begin, masked_row in ((3, 0), (4, 1), (5, 2), (2, None), (6, None)):
        logits = SuppressAtBegin([EOT, 1], sample_begin).apply(tokens, torch.zeros(1, 3, V))
        for row in range(3):
            expected = [1, EOT] if row == masked_row else []
            assert torch.nonzero(logits[0, row] == -torch.inf).flatten().tolist() == expected, (sample_begin, row)


def filters(timestamps: bool) -> list:
    """`whisper_filters` for the toy vocabulary (the one call of it in this file)."""
    special = SimpleNamespace(suppress_tokens=(3,), begin_suppress_tokens=(EOT,), eot=EOT,
                              no_timestamps=NO_TIMESTAMPS, timestamp_begin=TS)
    return whisper_filters(special, len(PROMPT), timestamps)


def test_whisper_filters_in_openai_whispers_order() -> None:
    assert [type(f) for f in filters(True)] == [SuppressAtBegin, SuppressTokens, TimestampRules]
    assert [type(f) for f in filters(False)] == [SuppressAtBegin, SuppressTokens]
    logits = torch.zeros(1, 1, V)
    logits[..., :TS] = TEXT_LOGIT
    for f in filters(True):
        logits = f.apply(torch.tensor([PROMPT + [12]]), logits)
    # After <12> (not the first sampled position, so end-of-text is allowed): text without the suppressed 3.
    assert torch.nonzero(logits[0, 0] > -torch.inf).flatten().tolist() == [0, 1, 2, 4, 5, 7, 8, 9]
