"""Draft sources: where the tokens that the model checks come from.

Each source has `begin` (a new sequence), `propose` (up to k tokens after the current ones) and `update`
(what the model kept), after transformers' `CandidateGenerator`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol, Sequence

import torch

from decoding.adapters import ModelAdapter
from decoding.filters import (
    LogitsFilter,
    SamplingOptions,
    apply_filters,
    sampling_probs,
)
from decoding.ragged import RaggedBatch


@dataclass
class Draft:
    """Tokens proposed for one round."""

    # Proposed token ids, in the model's vocabulary.
    tokens: list[int]
    # `[len(tokens), V_model]` distribution each token was sampled from; None for a deterministic proposal.
    probs: torch.Tensor | None = None
    # Assistant forward passes and seconds spent making the proposal.
    forward_passes: int = 0
    seconds: float = 0.0


class DraftSource(Protocol):
    """Proposes tokens for the model to verify, for every row of a batch (one row for `generate`)."""

    def begin(self, prompts: Sequence[Sequence[int]], sampling: SamplingOptions, generator: torch.Generator | None,
              stop_tokens: Sequence[int] = ()) -> None:
        """Starts new sequences; drafting stops after any of `stop_tokens`."""

    def propose(self, sequences: Sequence[Sequence[int]], max_tokens: Sequence[int],
                min_confidence: float | None) -> list[Draft]:
        """Proposes up to `max_tokens[b]` tokens (none when <= 0) to follow each whole sequence so far."""

    def update(self, sequences: Sequence[Sequence[int]], num_accepted: Sequence[int]) -> None:
        """Learns the sequences after verification; `num_accepted[b]` of row b's last proposal were kept."""

    def select(self, rows: Sequence[int]) -> None:
        """Keeps only the given rows (the others finished)."""


class AssistantDraft:
    """A smaller model with the same vocabulary drafts tokens, one batched forward pass per step.

    Each row's cache holds a prefix of its accepted sequence: after each round it is cut back to what the
    model kept, and the next round feeds only the tokens it has not seen (never the whole prefix again).

    Args:
        assistant: the assistant's adapter (per-row state for the same rows as the model's).
        filters: logit filters for every row, or
        row_filters: logit filters per row (Whisper's rules depend on each row's prompt).
        model_vocab_size: the model's vocabulary size, when it differs from the assistant's head.
    """

    def __init__(self, assistant: ModelAdapter, filters: Sequence[LogitsFilter] = (),
                 model_vocab_size: int | None = None,
                 row_filters: Sequence[Sequence[LogitsFilter]] | None = None) -> None:
        self.assistant = assistant
        self.filters = list(filters)
        self.row_filters = [list(f) for f in row_filters] if row_filters is not None else None
        self.model_vocab_size = model_vocab_size or assistant.vocab_size
        self.batch: RaggedBatch | None = None
        self.base_lengths: list[int] = []
        self.sampling = SamplingOptions()
        self.generator: torch.Generator | None = None
        self.stop_tokens: set[int] = set()

    def begin(self, prompts: Sequence[Sequence[int]], sampling: SamplingOptions, generator: torch.Generator | None,
              stop_tokens: Sequence[int] = ()) -> None:
        self.batch = RaggedBatch(self.assistant, len(prompts))
        self.base_lengths = [len(p) for p in prompts]
        self.sampling = sampling
        self.generator = generator
        self.stop_tokens = set(stop_tokens)

    def _filters(self, row: int) -> Sequence[LogitsFilter]:
        return self.row_filters[row] if self.row_filters is not None else self.filters

    @torch.inference_mode()
    def propose(self, sequences: Sequence[Sequence[int]], max_tokens: Sequence[int],
                min_confidence: float | None) -> list[Draft]:
        assert self.batch is not None, "begin() first"
        start = time.perf_counter()
        device = self.assistant.device
        rows = len(sequences)
        drafted: list[list[int]] = [[] for _ in range(rows)]
        probs: list[list[torch.Tensor]] = [[] for _ in range(rows)]
        passes = [0] * rows
        done = [k <= 0 for k in max_tokens]
        inputs = [list(seq[self.batch.length(b):]) if not done[b] else [] for b, seq in enumerate(sequences)]
        while not all(done):
            logits = self.batch.feed(inputs, 1)[:, -1]
            for b in range(rows):
                if not done[b]:
                    passes[b] += 1
                    if self._filters(b):
                        context = torch.tensor([list(sequences[b]) + drafted[b]], dtype=torch.long, device=device)
                        logits[b:b + 1] = apply_filters(self._filters(b), context, logits[b:b + 1, None])[:, 0]
            if self.sampling.greedy:
                choice = logits.argmax(-1)
                top = logits.softmax(-1).amax(-1) if min_confidence is not None else None
            else:
                q = sampling_probs(logits, self.sampling)
                choice = torch.multinomial(q, 1, generator=self.generator)[:, 0]
                top = q.amax(-1) if min_confidence is not None else None
            tokens = choice.tolist()  # one read-back per drafting step
            confidences = top.tolist() if top is not None else None
            for b in range(rows):
                if done[b]:
                    inputs[b] = []
                    continue
                drafted[b].append(tokens[b])
                if not self.sampling.greedy:
                    probs[b].append(q[b])
                inputs[b] = [tokens[b]]
                # Stop after an end-of-sequence token (nothing after it can be kept), at k, or, with the
                # confidence rule, after a token the assistant was unsure of.
                if (tokens[b] in self.stop_tokens or len(drafted[b]) >= max_tokens[b]
                        or (confidences is not None and confidences[b] < min_confidence)):
                    done[b] = True
                    inputs[b] = []
        self.base_lengths = [len(seq) for seq in sequences]
        share = (time.perf_counter() - start) / rows
        return [Draft(d, _fit_vocab(torch.stack(p), self.model_vocab_size) if p else None, n, share)
                for d, p, n in zip(drafted, probs, passes)]

    def update(self, sequences: Sequence[Sequence[int]], num_accepted: Sequence[int]) -> None:
        # The cache holds each old sequence plus the drafts it was fed; only the accepted ones stay valid.
        for b, (seq, accepted) in enumerate(zip(sequences, num_accepted)):
            self.rewind(b, min(self.base_lengths[b] + accepted, len(seq) - 1))

    def rewind(self, row: int, length: int) -> None:
        """Keeps at most the first `length` tokens of `row` in the assistant's cache."""
        assert self.batch is not None
        if length < self.batch.length(row):
            self.batch.rewind(row, length)

    def select(self, rows: Sequence[int]) -> None:
        assert self.batch is not None
        self.batch.select(rows)
        self.base_lengths = [self.base_lengths[r] for r in rows]
        if self.row_filters is not None:
            self.row_filters = [self.row_filters[r] for r in rows]


def _fit_vocab(probs: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Pads or trims `[n, V_assistant]` probabilities to the model's vocabulary size."""
    if probs.shape[-1] == vocab_size:
        return probs
    if probs.shape[-1] > vocab_size:
        return probs[:, :vocab_size]
    return torch.nn.functional.pad(probs, (0, vocab_size - probs.shape[-1]))


class PromptLookupDraft:
    """Drafts by n-gram lookup in the sequence itself (no second model), as transformers' prompt lookup.

    The last n tokens (n from `max_ngram` down to `min_ngram`) are searched for earlier in the sequence; the
    tokens that followed the most recent earlier match are proposed.
    """

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram

    def begin(self, prompts: Sequence[Sequence[int]], sampling: SamplingOptions, generator: torch.Generator | None,
              stop_tokens: Sequence[int] = ()) -> None:
        pass

    def propose(self, sequences: Sequence[Sequence[int]], max_tokens: Sequence[int],
                min_confidence: float | None) -> list[Draft]:
        return [self._lookup(seq, k) if k > 0 else Draft([]) for seq, k in zip(sequences, max_tokens)]

    def _lookup(self, tokens: Sequence[int], max_tokens: int) -> Draft:
        start = time.perf_counter()
        seq = torch.tensor(list(tokens), dtype=torch.long)
        for n in range(min(self.max_ngram, len(seq) - 1), self.min_ngram - 1, -1):
            windows = seq[:-1].unfold(0, n, 1) if len(seq) - 1 >= n else seq.new_empty((0, n))
            hits = (windows == seq[-n:]).all(dim=1).nonzero().flatten()
            if hits.numel():
                follow = int(hits[-1]) + n
                proposal = seq[follow:follow + max_tokens].tolist()
                if proposal:
                    return Draft(proposal, None, 0, time.perf_counter() - start)
        return Draft([], None, 0, time.perf_counter() - start)

    def update(self, sequences: Sequence[Sequence[int]], num_accepted: Sequence[int]) -> None:
        pass

    def select(self, rows: Sequence[int]) -> None:
        pass


class ReferenceDraft:
    """Drafts the continuation of a reference sequence that the output is expected to repeat (a live
    transcriber's last hypothesis of the same audio), and hands the rows it cannot draft to a fallback source.

    Where a row's tokens so far follow the reference (from `begin`'s prompt on), the next reference tokens are
    proposed; where they parted, the last `max_ngram`..1 tokens are looked up in the reference to find it again
    (a word inserted, a timestamp moved); where neither finds a continuation, the fallback drafts at most
    `fallback_k` tokens (none without a fallback). The model verifies every proposal, so the output is the same.

    A continuation found by a lookup is less sure than a prefix, and a rejected token in a check costs a row of
    the model's pass: the first proposal after a lookup is `resync_k` tokens, and each one kept whole lets the next
    be `growth` times as long (up to the round's k), so a row that has found the reference again soon drafts as
    a prefix does. A lookup that lands on the reference's last token proposes nothing: where the output parted
    from the reference, its end is what repeats least (a live hypothesis ends in the timestamp where its audio
    ended, which the next decode moves). In live decodes of the sonnets and of VoxPopuli this took 6 % and 2 %
    less of the model's time than proposing 8 tokens after every lookup (docs/live.md).

    Args:
        reference: the tokens expected after the prompt, for every row.
        fallback: the source for rows the reference cannot draft (an assistant), or None.
        fallback_k: most tokens the fallback drafts a round.
        max_ngram: longest tail looked up where the row parted from the reference.
        resync_k: tokens first proposed after such a lookup.
        growth: how much longer the next proposal after a lookup is, where the last one was kept whole.
    """

    def __init__(self, reference: Sequence[int], fallback: DraftSource | None = None, fallback_k: int = 5,
                 max_ngram: int = 3, resync_k: int = 2, growth: int = 4) -> None:
        self.reference = list(reference)
        self.resync_k = resync_k
        self.growth = growth
        self.fallback = fallback
        self.fallback_k = fallback_k
        self.max_ngram = max_ngram
        self.base_lengths: list[int] = []
        self._proposed: list[int] = []  # per row, the reference's proposal this round (0: none, or the fallback's)
        self._kept: list[int] = []  # per row, how many tokens of its last proposal were kept whole (else 0)
        self._fallback_proposed = False  # whether the fallback drafted this round (its update must follow)

    def begin(self, prompts: Sequence[Sequence[int]], sampling: SamplingOptions, generator: torch.Generator | None,
              stop_tokens: Sequence[int] = ()) -> None:
        self.base_lengths = [len(p) for p in prompts]
        self._proposed = [0] * len(prompts)
        self._kept = [0] * len(prompts)
        if self.fallback is not None:
            self.fallback.begin(prompts, sampling, generator, stop_tokens)

    def propose(self, sequences: Sequence[Sequence[int]], max_tokens: Sequence[int],
                min_confidence: float | None) -> list[Draft]:
        start = time.perf_counter()
        drafts = [Draft(self._continuation(seq[base:], k, kept)) if k > 0 else Draft([])
                  for seq, base, k, kept in zip(sequences, self.base_lengths, max_tokens, self._kept)]
        self._proposed = [len(d.tokens) for d in drafts]
        share = (time.perf_counter() - start) / max(len(drafts), 1)
        for draft in drafts:
            draft.seconds = share
        rest = [min(k, self.fallback_k) if not d.tokens else 0 for d, k in zip(drafts, max_tokens)]
        self._fallback_proposed = self.fallback is not None and max(rest, default=0) > 0
        if self._fallback_proposed:
            # A row the reference drafts asks the fallback for nothing: its cache stays a prefix of the row.
            for b, draft in enumerate(self.fallback.propose(sequences, rest, min_confidence)):
                if rest[b] > 0:
                    drafts[b] = draft
        return drafts

    def _continuation(self, generated: Sequence[int], k: int, kept: int) -> list[int]:
        n = len(generated)
        if self.reference[:n] == list(generated):
            return self.reference[n:n + k]
        for size in range(min(self.max_ngram, n), 0, -1):
            tail = list(generated[n - size:])
            for at in range(len(self.reference) - size, -1, -1):  # the latest match: the nearest continuation
                if self.reference[at:at + size] == tail and at + size < len(self.reference):
                    if at + size == len(self.reference) - 1:
                        return []
                    length = max(self.resync_k, self.growth * kept)
                    return self.reference[at + size:at + size + min(k, length)]
        return []

    def update(self, sequences: Sequence[Sequence[int]], num_accepted: Sequence[int]) -> None:
        self._kept = [accepted if 0 < proposed == accepted else 0
                      for proposed, accepted in zip(self._proposed, num_accepted)]
        # The fallback learns only the rounds it drafted: otherwise its cache still holds a prefix of each row,
        # and its next proposal feeds what the reference drafted first.
        if self._fallback_proposed:
            self.fallback.update(sequences, num_accepted)
        self._fallback_proposed = False

    def select(self, rows: Sequence[int]) -> None:
        self.base_lengths = [self.base_lengths[r] for r in rows]
        self._proposed = [self._proposed[r] for r in rows]
        self._kept = [self._kept[r] for r in rows]
        if self.fallback is not None:
            self.fallback.select(rows)
