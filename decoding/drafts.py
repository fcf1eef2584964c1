"""Draft sources: where the tokens that the model checks come from.

Each source has `begin` (a new sequence), `propose` (up to k tokens after the current ones) and `update`
(what the model kept), after transformers' `CandidateGenerator`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Protocol, Sequence

import torch

from decoding.adapters import ModelAdapter
from decoding.filters import LogitsFilter, SamplingOptions, apply_filters, sampling_probs


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
    """Proposes tokens for the model to verify."""

    def begin(self, prompt: Sequence[int], sampling: SamplingOptions, generator: torch.Generator | None,
              stop_tokens: Sequence[int] = ()) -> None:
        """Starts a new sequence that begins with `prompt`; drafting stops after any of `stop_tokens`."""

    def propose(self, tokens: Sequence[int], max_tokens: int, min_confidence: float | None) -> Draft:
        """Proposes up to `max_tokens` tokens to follow `tokens` (the whole sequence so far)."""

    def update(self, tokens: Sequence[int], num_accepted: int) -> None:
        """Learns the sequence after verification; `num_accepted` of the last proposal were kept."""


class AssistantDraft:
    """A smaller model with the same vocabulary drafts tokens one forward pass at a time.

    Its cache always holds a prefix of the accepted sequence: after each round it is cropped to what the model
    kept, and the next round feeds only the tokens it has not seen (never the whole prefix again).
    """

    def __init__(self, assistant: ModelAdapter, filters: Sequence[LogitsFilter] = (), model_vocab_size: int | None = None) -> None:
        self.assistant = assistant
        self.filters = list(filters)
        self.model_vocab_size = model_vocab_size or assistant.vocab_size
        self.cache: Any = None
        self.cache_len = 0
        self.base_len = 0
        self.sampling = SamplingOptions()
        self.generator: torch.Generator | None = None
        self.stop_tokens: set[int] = set()

    def begin(self, prompt: Sequence[int], sampling: SamplingOptions, generator: torch.Generator | None,
              stop_tokens: Sequence[int] = ()) -> None:
        self.cache = self.assistant.new_cache()
        self.cache_len = 0
        self.sampling = sampling
        self.generator = generator
        self.stop_tokens = set(stop_tokens)

    @torch.inference_mode()
    def propose(self, tokens: Sequence[int], max_tokens: int, min_confidence: float | None) -> Draft:
        start = time.perf_counter()
        device = self.assistant.device
        context = torch.tensor([list(tokens)], dtype=torch.long, device=device)
        step_input = context[:, self.cache_len:]
        drafted: list[torch.Tensor] = []
        probs: list[torch.Tensor] = []
        for _ in range(max_tokens):
            logits = self.assistant.forward(step_input, self.cache, 1)
            self.cache_len += step_input.shape[1]
            logits = apply_filters(self.filters, context, logits)[0, -1]
            if self.sampling.greedy:
                token = logits.argmax(-1)
                top_prob = logits.softmax(-1)[token] if min_confidence is not None else None
            else:
                q = sampling_probs(logits, self.sampling)
                token = torch.multinomial(q, 1, generator=self.generator)[0]
                probs.append(q)
                top_prob = q.max() if min_confidence is not None else None
            drafted.append(token)
            step_input = token.view(1, 1)
            context = torch.cat([context, step_input], dim=1)
            # Nothing after an end-of-sequence token can be kept: stop there.
            if self.stop_tokens and int(token) in self.stop_tokens:
                break
            # The confidence rule keeps the unsure token and stops after it (one host sync per step).
            if top_prob is not None and top_prob.item() < min_confidence:
                break
        self.base_len = len(tokens)
        draft_probs = None
        if probs:
            draft_probs = _fit_vocab(torch.stack(probs), self.model_vocab_size)
        return Draft(torch.stack(drafted).tolist(), draft_probs, len(drafted), time.perf_counter() - start)

    def update(self, tokens: Sequence[int], num_accepted: int) -> None:
        # The cache holds the old sequence plus the drafts it was fed; only the accepted ones stay valid.
        self.rewind(min(self.base_len + num_accepted, len(tokens) - 1))

    def rewind(self, length: int) -> None:
        """Keeps at most the first `length` tokens in the assistant's cache."""
        if length < self.cache_len:
            self.assistant.crop(self.cache, length)
            self.cache_len = length


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

    def begin(self, prompt: Sequence[int], sampling: SamplingOptions, generator: torch.Generator | None,
              stop_tokens: Sequence[int] = ()) -> None:
        pass

    def propose(self, tokens: Sequence[int], max_tokens: int, min_confidence: float | None) -> Draft:
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

    def update(self, tokens: Sequence[int], num_accepted: int) -> None:
        pass
