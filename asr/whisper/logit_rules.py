"""Whisper's rules on the logits (openai-whisper `decoding.py`), as filters for the generic engine.

Every filter handles the logits of several positions at once: row `j` of `[1, P, V]` predicts position
`L - P + 1 + j` of the `[1, L]` token context, drafts included.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import torch

from decoding.filters import LogitsFilter, SuppressTokens

if TYPE_CHECKING:
    from asr.models.tokenizer import SpecialTokens


class SuppressAtBegin:
    """At the first sampled position, forbid a blank or end-of-text (openai-whisper's SuppressBlank)."""

    def __init__(self, token_ids: Sequence[int], sample_begin: int) -> None:
        self.token_ids = list(token_ids)
        self.sample_begin = sample_begin

    def apply(self, tokens: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        first = tokens.shape[1] - logits.shape[1] + 1
        row = self.sample_begin - first
        if 0 <= row < logits.shape[1]:
            logits[0, row, self.token_ids] = -torch.inf
        return logits


class TimestampRules:
    """Timestamp tokens come in pairs, never decrease, and win when their total probability beats any text token.

    The rules of openai-whisper's ApplyTimestampRules, applied position by position over the checked drafts.
    """

    def __init__(self, *, sample_begin: int, eot: int, no_timestamps: int, timestamp_begin: int,
                 max_initial_timestamp_index: int | None = 50) -> None:
        self.sample_begin = sample_begin
        self.eot = eot
        self.no_timestamps = no_timestamps
        self.timestamp_begin = timestamp_begin
        self.max_initial_timestamp_index = max_initial_timestamp_index

    def apply(self, tokens: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        ts = self.timestamp_begin
        positions = logits.shape[1]
        first = tokens.shape[1] - positions + 1
        context = tokens[0].tolist()
        rows = logits[0]
        rows[:, self.no_timestamps] = -torch.inf
        for j in range(positions):
            sampled = context[self.sample_begin: first + j]
            row = rows[j]
            if not sampled:
                # The first token is a timestamp, and not later than max_initial_timestamp.
                row[:ts] = -torch.inf
                if self.max_initial_timestamp_index is not None:
                    row[ts + self.max_initial_timestamp_index + 1:] = -torch.inf
                continue
            last_was_timestamp = sampled[-1] >= ts
            penultimate_was_timestamp = len(sampled) < 2 or sampled[-2] >= ts
            if last_was_timestamp:
                if penultimate_was_timestamp:
                    row[ts:] = -torch.inf
                else:
                    row[: self.eot] = -torch.inf
            last_timestamp = next((t for t in reversed(sampled) if t >= ts), None)
            if last_timestamp is not None:
                # Timestamps never decrease, and a segment has non-zero length.
                bound = last_timestamp if last_was_timestamp and not penultimate_was_timestamp else last_timestamp + 1
                row[ts:bound] = -torch.inf
        # When the timestamps together outweigh the best text token, a timestamp must come (no host sync).
        # openai-whisper compares log-probabilities; log-softmax shifts every logit of a row by the same
        # amount, so the raw logits give the same comparison without normalising the whole vocabulary.
        timestamp_mass = rows[:, ts:].logsumexp(-1)
        best_text = rows[:, :ts].amax(-1)  # amax: max()'s indices cost ~10x its values over a vocabulary
        rows[:, :ts].masked_fill_((timestamp_mass > best_text).unsqueeze(-1), -torch.inf)
        return logits


def screen_exact_ids(filters: Sequence[LogitsFilter], special: SpecialTokens, vocab_size: int) -> list[int] | None:
    """The ids a screened head (`decoding.kernels.screened_head`) must give in float32 for greedy decoding under these
    filters to take float32's argmax, or None when a filter is not one of Whisper's rules.

    The rules mask single ids (suppressed, blank at begin), whole ranges that start at end-of-text or at the
    timestamps, or every id below them at once (`TimestampRules`), and compare the timestamps' total with the
    best text logit: so the ids they name one by one and every id from end-of-text up are computed in float32,
    and the text ids between may be screened."""
    exact = set(range(special.eot, vocab_size))
    for f in filters:
        if isinstance(f, SuppressAtBegin):
            exact.update(f.token_ids)
        elif isinstance(f, SuppressTokens):
            exact.update(f.token_ids.tolist())
        elif not isinstance(f, TimestampRules) or f.eot != special.eot or f.timestamp_begin < special.eot:
            return None
    return sorted(i for i in exact if 0 <= i < vocab_size)


def whisper_filters(special: SpecialTokens, sample_begin: int, timestamps: bool,
                    max_initial_timestamp_index: int | None = 50,
                    suppress_tokens: Sequence[int] | None = None) -> list[LogitsFilter]:
    """The filters openai-whisper applies, in its order: blank at begin, suppressed tokens, timestamp rules.

    Args:
        special: the model's special tokens (suppress lists, end of text, timestamp ids).
        sample_begin: the prompt's length: the first generated position.
        timestamps: whether the model predicts timestamp tokens.
        max_initial_timestamp_index: the latest timestamp the first one may be (50: 1 s), None for any.
        suppress_tokens: ids suppressed at every step; None for the model's own list.
    """
    filters: list[LogitsFilter] = [SuppressAtBegin(special.begin_suppress_tokens, sample_begin),
                                   SuppressTokens(special.suppress_tokens if suppress_tokens is None else suppress_tokens)]
    if timestamps:
        filters.append(TimestampRules(sample_begin=sample_begin, eot=special.eot, no_timestamps=special.no_timestamps,
                                      timestamp_begin=special.timestamp_begin,
                                      max_initial_timestamp_index=max_initial_timestamp_index))
    return filters
