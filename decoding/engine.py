"""The assisted-generation loop, generic over models through adapters, for one sequence or a ragged batch.

Terms: the *model* is the large model whose output we want; the *assistant* (or any draft source) proposes
tokens. The model's cache always holds every token of a row but the last; a round feeds each row's last token
plus its k drafts, so one forward pass both checks the drafts and gives the model's own next token (a model whose
prompt pass gives the numbers of its steps takes a lone prompt whole with the first drafts: one pass fewer). Rows
draft, accept and rewind by their own amounts (`decoding.ragged`); finished rows leave the batch.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Sequence

import torch

from decoding.adapters import ModelAdapter
from decoding.drafts import Draft, DraftSource
from decoding.filters import (
    LogitsFilter,
    SamplingOptions,
    apply_filters,
    sampling_probs,
)
from decoding.ragged import RaggedBatch, fused_prompt, logits_back, prefill
from decoding.schedule import DraftSchedule, make_schedule
from decoding.stats import GenerationStats


@dataclass(frozen=True)
class GenerationOptions:
    """What to generate and how to draft."""

    # Limits: new tokens after the prompt, end-of-sequence ids, and the model's total length (prompt included).
    max_new_tokens: int = 256
    eos_token_ids: tuple[int, ...] = ()
    max_length: int | None = None
    # Token choice: greedy when temperature is 0, else sampling (top-k / top-p optional).
    sampling: SamplingOptions = field(default_factory=SamplingOptions)
    # Seed for sampling (None: torch's global random state).
    seed: int | None = None
    # Drafting: the schedule (heuristic, constant, confidence), its k, and the confidence rule's threshold.
    schedule: str = "heuristic"
    num_assistant_tokens: int = 5
    confidence_threshold: float = 0.4
    # Also return the model's raw logits at this prompt position (Python-style index; negative counts from
    # the end, which is the same place in every row of a batch). Whisper's no-speech probability uses it.
    prompt_logits_at: int | None = None

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        make_schedule(self.schedule, self.num_assistant_tokens, self.confidence_threshold)


@dataclass
class GenerationResult:
    """Generated tokens (prompt excluded) and how they were made."""

    tokens: list[int]
    # Model log-probability of each generated token, after the filters, at temperature 1.
    logprobs: list[float]
    stats: GenerationStats
    # True when generation ended on an end-of-sequence token (False: a length limit).
    finished: bool
    # `[V]` raw model logits at `options.prompt_logits_at`, when asked for.
    prompt_logits: torch.Tensor | None = None


@dataclass
class _Row:
    """One sequence being generated."""

    tokens: list[int]
    limit: int
    filters: Sequence[LogitsFilter]
    schedule: DraftSchedule
    result: GenerationResult

    @property
    def generated(self) -> int:
        return len(self.result.tokens)


def generate(
    model: ModelAdapter,
    prompt: Sequence[int],
    options: GenerationOptions,
    draft: DraftSource | None = None,
    filters: Sequence[LogitsFilter] = (),
) -> GenerationResult:
    """Generates from `model`, with tokens drafted by `draft` and checked by the model when given.

    Greedy output is the model's own greedy output token for token; sampled output has the model's own
    distribution (speculative sampling). Without a draft source this is plain decoding, one token per pass.

    Args:
        model: the model's adapter.
        prompt: token ids to continue (at least one).
        options: limits, sampling and drafting options.
        draft: where drafts come from (an assistant model, prompt lookup, ...), or None.
        filters: logit filters applied to the model (and by the draft source to its own logits).

    Returns:
        The generated tokens with their log-probabilities and statistics.

    Raises:
        ValueError: an empty prompt, or one that leaves no room under `options.max_length`.
    """
    return generate_batch(model, [prompt], options, draft, [filters])[0]


@torch.inference_mode()
def generate_batch(
    model: ModelAdapter,
    prompts: Sequence[Sequence[int]],
    options: GenerationOptions,
    draft: DraftSource | None = None,
    filters: Sequence[Sequence[LogitsFilter]] | None = None,
) -> list[GenerationResult]:
    """`generate` for several prompts at once, each row drafting and accepting its own number of tokens.

    The adapter (and the draft source) must hold per-row state for exactly these rows, in this order (for
    Whisper: one encoder output per row). Each row's tokens are those `generate` gives for it alone, up to
    floating-point differences between batched and single kernels.

    Args:
        model: the model's adapter.
        prompts: one prompt per row.
        options: shared limits, sampling and drafting options.
        draft: a draft source for all rows, or None.
        filters: logit filters per row (None: no filters).

    Returns:
        One result per prompt, in order.
    """
    start = time.perf_counter()
    filters = filters if filters is not None else [()] * len(prompts)
    rows = [_new_row(p, options, f) for p, f in zip(prompts, filters)]
    generator = torch.Generator(device=model.device).manual_seed(options.seed) if options.seed is not None else None
    sampling = options.sampling
    eos = set(options.eos_token_ids)
    batch = RaggedBatch(model, len(rows))

    if draft is not None:
        draft.begin([r.tokens for r in rows], sampling, generator, options.eos_token_ids)

    active = rows
    prefilled = False
    while active:
        # 1. Draft: up to k tokens per row, leaving room for the model's own token within the limit.
        proposals = [Draft([]) for _ in active]
        if draft is not None:
            rooms = [min(r.schedule.next_k(), r.limit - r.generated - 1) for r in active]
            if max(rooms) > 0:
                proposals = draft.propose([r.tokens for r in active], rooms, active[0].schedule.min_confidence)
                for row, proposal, room in zip(active, proposals, rooms):
                    proposal.tokens = proposal.tokens[:max(room, 0)]
                    row.result.stats.assistant_forward_passes += proposal.forward_passes
                    row.result.stats.assistant_seconds += proposal.seconds
        width = max(len(p.tokens) for p in proposals) + 1

        # 2. Prefill, before the first check: each row's cache takes every prompt token but the last, unless the
        # whole prompt is fed with that check, in one pass (`ragged.fused_prompt`).
        back: list[int | None] = [None] * len(active)
        if not prefilled:
            prefilled = True
            if fused_prompt(model, [r.tokens for r in rows], [p.tokens for p in proposals]):
                back = [logits_back(rows[0].tokens, options.prompt_logits_at)]
                width += back[0] or 0
            else:
                found = prefill(batch, [r.tokens for r in rows], options.prompt_logits_at,
                                [r.result.stats for r in rows])
                for row, logits in zip(rows, found):
                    row.result.prompt_logits = logits

        # 3. Verify: one model pass over each row's tokens not yet in the cache (its last) and its drafts.
        t = time.perf_counter()
        logits = batch.feed([r.tokens[batch.length(b):] + p.tokens for b, (r, p) in enumerate(zip(active, proposals))],
                            width)
        elapsed = (time.perf_counter() - t) / len(active)
        row_logits = []
        for b, (row, proposal) in enumerate(zip(active, proposals)):
            k = len(proposal.tokens)
            row.result.stats.model_seconds += elapsed
            row.result.stats.model_forward_passes += 1
            if row.result.prompt_logits is None and options.prompt_logits_at is not None and row.generated == 0:
                row.result.prompt_logits = logits[b, width - k - 1 - (back[b] or 0)].clone()
            checked = logits[b:b + 1, width - k - 1:]
            if row.filters:
                context = torch.tensor([row.tokens + proposal.tokens], dtype=torch.long, device=model.device)
                checked = apply_filters(row.filters, context, checked)
            row_logits.append(checked[0])

        # 4. Accept: the agreeing prefix plus the model's own token (or speculative sampling).
        if sampling.greedy:
            outcomes = greedy_accept_rows(row_logits, [p.tokens for p in proposals])
        else:
            outcomes = []
            for lg, proposal in zip(row_logits, proposals):
                accepted, kept = speculative_accept(sampling_probs(lg, sampling),
                                                    proposal.probs if proposal.tokens else None,
                                                    proposal.tokens, generator)
                outcomes.append((accepted, kept, _logprobs(lg, kept)))

        # 5. Limits, statistics, and 6. roll back: caches keep only what was accepted.
        still = []
        accepted_counts = []
        for b, (row, proposal, (accepted, kept, kept_logprobs)) in enumerate(zip(active, proposals, outcomes)):
            accepted = _extend(row, proposal, accepted, kept, kept_logprobs, eos, draft is not None)
            accepted_counts.append(accepted)
            if not row.result.finished and row.generated < row.limit:
                still.append(b)
                batch.rewind(b, len(row.tokens) - 1)
                row.schedule.update(len(proposal.tokens), accepted)
        if draft is not None:
            draft.update([r.tokens for r in active], accepted_counts)
        if len(still) < len(active):
            active = [active[b] for b in still]
            if active:
                batch.select(still)
                if draft is not None:
                    draft.select(still)

    total = time.perf_counter() - start
    for row in rows:
        row.result.stats.generated_tokens = row.generated
        row.result.stats.total_seconds = total
    return [row.result for row in rows]


def token_limit(prompt: Sequence[int], options: GenerationOptions) -> int:
    """How many tokens may follow `prompt`: `max_new_tokens`, less where `max_length` leaves less room.

    Raises:
        ValueError: an empty prompt, or one that leaves no room under `max_length`.
    """
    if not prompt:
        raise ValueError("the prompt must hold at least one token")
    limit = options.max_new_tokens
    if options.max_length is not None:
        limit = min(limit, options.max_length - len(prompt))
        if limit < 1:
            raise ValueError(f"the prompt has {len(prompt)} tokens; the model takes at most {options.max_length}")
    return limit


def _new_row(prompt: Sequence[int], options: GenerationOptions, filters: Sequence[LogitsFilter]) -> _Row:
    schedule = make_schedule(options.schedule, options.num_assistant_tokens, options.confidence_threshold)
    return _Row(list(prompt), token_limit(prompt, options), filters, schedule,
                GenerationResult([], [], GenerationStats(), False))


def _extend(row: _Row, proposal: Draft, accepted: int, kept: list[int], kept_logprobs: list[float],
            eos: set[int], drafting: bool) -> int:
    """Appends a round's kept tokens to a row, cut at end-of-sequence and the limit; returns drafts kept."""
    end = next((i + 1 for i, tok in enumerate(kept) if tok in eos), None)
    if end is not None:
        kept, kept_logprobs = kept[:end], kept_logprobs[:end]
        row.result.finished = True
    kept = kept[: row.limit - row.generated]
    row.tokens += kept
    row.result.tokens += kept
    row.result.logprobs += kept_logprobs[: len(kept)]
    accepted = min(accepted, len(kept))
    stats = row.result.stats
    k = len(proposal.tokens)
    stats.rounds += 1
    stats.drafted_tokens += k
    stats.accepted_tokens += accepted
    if drafting:
        # Rounds without drafts (no lookup match, no room left) accept nothing but reject nothing either.
        if k:
            stats.accepted_length_histogram[accepted] += 1
        stats.draft_lengths.append(k)
    return accepted


def _logprobs(logits: torch.Tensor, tokens: list[int]) -> list[float]:
    rows = torch.arange(len(tokens), device=logits.device)
    ids = torch.tensor(tokens, dtype=torch.long, device=logits.device)
    return torch.log_softmax(logits[: len(tokens)].float(), dim=-1)[rows, ids].tolist()


# Verification: which drafted tokens the model keeps, and its own next token. Each function does its work on
# the device and reads back to the host once.


def speculative_accept(
    probs: torch.Tensor,
    draft_probs: torch.Tensor | None,
    drafts: list[int],
    generator: torch.Generator | None,
) -> tuple[int, list[int]]:
    """Speculative sampling (Leviathan et al. 2023; Chen et al. 2023).

    Draft token x_j, drawn from q_j, is kept with probability min(1, p_j(x) / q_j(x)); at the first rejection the
    token is drawn from the residual normalise(max(p_j - q_j, 0)); if every draft is kept, one more token is
    drawn from p_k. The output then has exactly the model's distribution p, whatever q is. A deterministic
    proposal (prompt lookup, re-tokenised drafts) is the case q = one-hot(x).

    Args:
        probs: `[k + 1, V]` model sampling distributions (temperature, top-k, top-p applied).
        draft_probs: `[k, V]` the distributions the drafts were sampled from, or None when deterministic.
        drafts: the k drafted token ids.
        generator: random source, for reproducible runs.

    Returns:
        (number of drafts accepted, the new tokens).
    """
    k = len(drafts)
    rows = torch.arange(k, device=probs.device)
    draft_ids = torch.tensor(drafts, dtype=torch.long, device=probs.device)
    if draft_probs is None:
        draft_probs = torch.zeros_like(probs[:k])
        draft_probs[rows, draft_ids] = 1.0
    p_draft = probs[rows, draft_ids]
    q_draft = draft_probs[rows, draft_ids]
    uniform = torch.rand(k, device=probs.device, generator=generator)
    accepted = (uniform * q_draft < p_draft).int().cumprod(0).sum()
    # Residual distributions for every position; row k (all accepted) is the model's own distribution.
    residual = torch.cat([(probs[:k] - draft_probs).clamp_min(0), probs[k:]], dim=0)
    mass = residual.sum(-1, keepdim=True)
    # Where p == q exactly the residual is empty, but then a rejection has probability 0; fall back to p.
    residual = torch.where(mass > 0, residual / mass.clamp_min(1e-30), probs)
    chosen_row = residual.index_select(0, accepted.view(1))[0]
    bonus = torch.multinomial(chosen_row, 1, generator=generator)
    n, token = torch.cat([accepted.view(1), bonus]).tolist()
    return n, drafts[:n] + [token]


def greedy_accept_rows(logits: list[torch.Tensor], drafts: list[list[int]]) -> list[tuple[int, list[int], list[float]]]:
    """Keeps each row's drafts that match the model's argmax, plus the model's token at the first mismatch.

    Everything is read back to the host once, for all rows.

    Args:
        logits: per row, `[k_b + 1, V]` filtered model logits.
        drafts: per row, the k_b drafted token ids.

    Returns:
        Per row: (drafts accepted, new tokens, their log-probabilities).
    """
    parts = []
    for row_logits, row_drafts in zip(logits, drafts):
        choice = row_logits.argmax(-1)
        best_logprob = torch.log_softmax(row_logits.float(), dim=-1).amax(-1)
        draft_ids = torch.tensor(row_drafts, dtype=torch.long, device=row_logits.device)
        agreed = (choice[: len(row_drafts)] == draft_ids).int().cumprod(0).sum().view(1)
        parts += [choice.double(), agreed.double(), best_logprob.double()]
    values = torch.cat(parts).tolist()  # the one read-back
    out, offset = [], 0
    for row_drafts in drafts:
        k = len(row_drafts)
        choice, n = values[offset: offset + k + 1], int(values[offset + k + 1])
        logprobs = values[offset + k + 2: offset + 2 * k + 3]
        out.append((n, [int(t) for t in choice[: n + 1]], logprobs[: n + 1]))
        offset += 2 * k + 3
    return out
