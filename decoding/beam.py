"""Beam search over a model adapter for a batch of prompts: openai-whisper's `BeamSearchDecoder` and
`MaximumLikelihoodRanker`, with the model's KV cache.

Each prompt keeps `beam_size` live beams. A step feeds every live beam's last token (one model pass for all
beams of all prompts), applies the prompt's logit filters to each beam's logits, takes log-softmax and expands
every beam by its `beam_size + 1` most likely tokens, scored by cumulative log-probability (float32, as
openai-whisper's tensor sums). Candidates are ranked (ties keep the order they were made in); those ending in
an end-of-sequence token are collected as finished, the best `beam_size` others are the next beams. A prompt
is done when `round(beam_size * patience)` sequences have finished or its beams reach the length limit; if
fewer than `beam_size` finished, the best live beams fill up the list. The caches follow the beams by row
selection (`RaggedBatch.select` with repeated rows). Beam search is plain decoding: no draft source.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Sequence

import torch

from decoding.adapters import ModelAdapter
from decoding.engine import GenerationOptions, token_limit
from decoding.filters import LogitsFilter, apply_filters
from decoding.ragged import RaggedBatch, prefill
from decoding.stats import GenerationStats


@dataclass(frozen=True)
class BeamOptions:
    """openai-whisper's beam settings."""

    beam_size: int = 5
    # Finished sequences to collect before stopping, as a multiple of beam_size (None: 1.0).
    patience: float | None = None

    def __post_init__(self) -> None:
        if self.beam_size < 1:
            raise ValueError(f"beam size must be >= 1, got {self.beam_size}")
        if self.patience is not None and not self.patience > 0:
            raise ValueError(f"patience must be > 0, got {self.patience}")
        if self.max_candidates < 1:
            raise ValueError(f"beam size {self.beam_size} with patience {self.patience} collects no sequence")

    @property
    def max_candidates(self) -> int:
        return round(self.beam_size * (self.patience or 1.0))


@dataclass
class Candidate:
    """One finished (or, at the length limit, unfinished) sequence of a beam search."""

    tokens: list[int]  # generated tokens, the end-of-sequence token excluded
    sum_logprob: float  # log-probabilities summed (the end-of-sequence token's included when finished)
    finished: bool


@dataclass
class BeamResult:
    """A prompt's candidates in openai-whisper's order (finished ones as collected, then live ones)."""

    candidates: list[Candidate]
    stats: GenerationStats
    # `[V]` raw model logits at `options.prompt_logits_at`, when asked for.
    prompt_logits: torch.Tensor | None = None

    def best(self, length_penalty: float | None = None) -> Candidate:
        return self.candidates[rank([len(c.tokens) for c in self.candidates],
                                    [c.sum_logprob for c in self.candidates], length_penalty)]


def rank(lengths: Sequence[int], sum_logprobs: Sequence[float], length_penalty: float | None = None) -> int:
    """openai-whisper's `MaximumLikelihoodRanker`: the index of the highest sum log-probability over the length
    (None), or over the Google NMT penalty `((5 + length) / 6) ** length_penalty`; the first of equals.
    An empty sequence counts as one token long (openai-whisper would divide by zero)."""
    def score(length: int, logprob: float) -> float:
        penalty = max(length, 1) if length_penalty is None else ((5 + length) / 6) ** length_penalty
        return logprob / penalty

    scores = [score(n, lp) for n, lp in zip(lengths, sum_logprobs)]
    return max(range(len(scores)), key=scores.__getitem__)


@dataclass
class _Prompt:
    """One prompt's search."""

    tokens: list[int]
    limit: int
    filters: Sequence[LogitsFilter]
    beams: list[tuple[list[int], float]] = field(default_factory=lambda: [([], 0.0)])  # generated, score
    finished: dict[tuple[int, ...], float] = field(default_factory=dict)
    stats: GenerationStats = field(default_factory=GenerationStats)
    prompt_logits: torch.Tensor | None = None
    done: bool = False


@torch.inference_mode()
def beam_search_batch(
    model: ModelAdapter,
    prompts: Sequence[Sequence[int]],
    options: GenerationOptions,
    beam: BeamOptions,
    filters: Sequence[Sequence[LogitsFilter]] | None = None,
) -> list[BeamResult]:
    """Beam search for several prompts at once; each prompt's result is the one it gets alone.

    The adapter must hold per-row state for exactly these prompts, in order (it is narrowed and widened to the
    live beams as the search goes). Uses `options`' limits, end-of-sequence ids and `prompt_logits_at`; its
    sampling and drafting settings do not apply.

    Returns:
        One result per prompt, in order.

    Raises:
        ValueError: an empty prompt, or one that leaves no room under `options.max_length`.
    """
    start = time.perf_counter()
    filters = filters if filters is not None else [()] * len(prompts)
    states = [_Prompt(list(p), token_limit(p, options), f) for p, f in zip(prompts, filters)]
    eos = set(options.eos_token_ids)
    batch = RaggedBatch(model, len(states))
    found = prefill(batch, [s.tokens for s in states], options.prompt_logits_at, [s.stats for s in states])
    for state, logits in zip(states, found):
        state.prompt_logits = logits
    # Batch rows: (prompt, beam) per row; one row per prompt at first (its beams are all the prompt).
    rows = [(p, 0) for p in range(len(states))]
    first = True
    while rows:
        t = time.perf_counter()
        logits = batch.feed([[(states[p].tokens + states[p].beams[j][0])[-1]] for p, j in rows], 1)
        elapsed = (time.perf_counter() - t) / len({p for p, _ in rows})
        for p in {p for p, _ in rows}:
            states[p].stats.model_forward_passes += 1
            states[p].stats.model_seconds += elapsed
            states[p].stats.rounds += 1
        if first and options.prompt_logits_at is not None:
            for b, (p, _) in enumerate(rows):  # the position was the prompt's last: its logits come now
                if states[p].prompt_logits is None:
                    states[p].prompt_logits = logits[b, 0].clone()
        first = False
        for b, (p, j) in enumerate(rows):
            state = states[p]
            if state.filters:
                context = torch.tensor([state.tokens + state.beams[j][0]], dtype=torch.long, device=model.device)
                logits[b:b + 1] = apply_filters(state.filters, context, logits[b:b + 1])
        logprobs = torch.log_softmax(logits[:, 0].float(), dim=-1)
        values, ids = logprobs.topk(beam.beam_size + 1, dim=-1)
        sums = torch.tensor([states[p].beams[j][1] for p, j in rows], dtype=torch.float32, device=values.device)
        scores = (sums[:, None] + values).tolist()  # float32 sums, as openai-whisper's tensor arithmetic
        ids = ids.tolist()
        sources: list[int] = []
        next_rows: list[tuple[int, int]] = []
        for p in dict.fromkeys(p for p, _ in rows):
            mine = [b for b, (q, _) in enumerate(rows) if q == p]
            kept = _step(states[p], mine, [rows[b][1] for b in mine], scores, ids, beam, eos)
            if not states[p].done:
                sources += kept
                next_rows += [(p, j) for j in range(len(kept))]
        if next_rows:
            # Beams reordered within their prompts: the adapter's per-prompt state stays where it is.
            batch.select(sources, same_state=[p for p, _ in next_rows] == [p for p, _ in rows])
        rows = next_rows

    total = time.perf_counter() - start
    results = []
    for state in states:
        state.stats.total_seconds = total
        results.append(BeamResult(_finalize(state, beam.beam_size), state.stats, state.prompt_logits))
    return results


def _step(state: _Prompt, batch_rows: list[int], beam_indices: list[int], scores: list[list[float]],
          ids: list[list[int]], beam: BeamOptions, eos: set[int]) -> list[int]:
    """One step of one prompt: new beams (in rank order) and finished sequences; returns the batch row each new
    beam continues."""
    candidates: dict[tuple[int, ...], float] = {}
    sources: dict[tuple[int, ...], int] = {}
    for b, j in zip(batch_rows, beam_indices):
        prefix = state.beams[j][0]
        for score, token in zip(scores[b], ids[b]):
            sequence = tuple(prefix + [token])
            candidates[sequence] = score
            sources[sequence] = b
    beams, kept, newly = [], [], {}
    for sequence in sorted(candidates, key=candidates.__getitem__, reverse=True):
        if sequence[-1] in eos:
            newly[sequence] = candidates[sequence]
        else:
            beams.append((list(sequence), candidates[sequence]))
            kept.append(sources[sequence])
            if len(beams) == beam.beam_size:
                break
    for sequence, score in newly.items():
        if len(state.finished) >= beam.max_candidates:
            break
        state.finished[sequence] = score
    state.beams = beams
    length = len(beams[0][0])
    state.stats.generated_tokens = length
    state.done = len(state.finished) >= beam.max_candidates or length >= state.limit
    return kept


def _finalize(state: _Prompt, beam_size: int) -> list[Candidate]:
    """The finished sequences, filled up to `beam_size` with the best live beams (openai-whisper's `finalize`)."""
    sequences = dict(state.finished)
    if len(sequences) < beam_size:
        ascending = sorted(range(len(state.beams)), key=lambda j: state.beams[j][1])
        for j in reversed(ascending):  # numpy's argsort(...)[::-1] over a few beams: equals latest first
            tokens, score = state.beams[j]
            sequences[tuple(tokens) + (None,)] = score
            if len(sequences) >= beam_size:
                break
    return [Candidate(list(s[:-1]), score, s[-1] is not None) for s, score in sequences.items()]
