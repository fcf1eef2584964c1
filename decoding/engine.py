"""The assisted-generation loop, generic over models through adapters.

Terms: the *model* is the large model whose output we want; the *assistant* (or any draft source) proposes
tokens. The model's cache always holds every token but the last one; a round feeds the last token plus k
drafts, so one forward pass both checks the drafts and gives the model's own next token.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Sequence

import torch

from decoding.adapters import ModelAdapter
from decoding.drafts import Draft, DraftSource
from decoding.filters import LogitsFilter, SamplingOptions, apply_filters, sampling_probs
from decoding.schedule import make_schedule
from decoding.stats import GenerationStats
from decoding.verify import greedy_accept, speculative_accept


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
    # Also return the model's raw logits at this prompt position (Whisper's no-speech probability).
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


@torch.inference_mode()
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
    start = time.perf_counter()
    prompt = list(prompt)
    if not prompt:
        raise ValueError("the prompt must hold at least one token")
    limit = options.max_new_tokens
    if options.max_length is not None:
        limit = min(limit, options.max_length - len(prompt))
        if limit < 1:
            raise ValueError(f"the prompt has {len(prompt)} tokens; the model takes at most {options.max_length}")
    sampling = options.sampling
    generator = None
    if options.seed is not None:
        generator = torch.Generator(device=model.device).manual_seed(options.seed)
    schedule = make_schedule(options.schedule, options.num_assistant_tokens, options.confidence_threshold)
    eos = set(options.eos_token_ids)
    stats = GenerationStats()
    cache = model.new_cache()

    # 1. Prefill: the model's cache takes every prompt token but the last.
    prompt_logits = None
    want_prompt_logits = options.prompt_logits_at
    if len(prompt) > 1:
        num_logits = 0
        if want_prompt_logits is not None and want_prompt_logits < len(prompt) - 1:
            num_logits = len(prompt) - 1 - want_prompt_logits
        t = time.perf_counter()
        logits = model.forward(_ids(prompt[:-1], model.device), cache, num_logits)
        stats.model_seconds += time.perf_counter() - t
        stats.model_forward_passes += 1
        if num_logits:
            prompt_logits = logits[0, 0].clone()
            want_prompt_logits = None
    if draft is not None:
        draft.begin(prompt, sampling, generator, options.eos_token_ids)

    tokens = prompt
    new_tokens: list[int] = []
    logprobs: list[float] = []
    finished = False
    while True:
        # 2. Draft: up to k tokens, leaving room for the model's own token within the limit.
        proposal = Draft([])
        room = limit - len(new_tokens) - 1
        if draft is not None and room > 0:
            proposal = draft.propose(tokens, min(schedule.next_k(), room), schedule.min_confidence)
            proposal.tokens = proposal.tokens[:room]
            stats.assistant_forward_passes += proposal.forward_passes
            stats.assistant_seconds += proposal.seconds
        k = len(proposal.tokens)

        # 3. Verify: one model pass over the last token and the drafts.
        t = time.perf_counter()
        logits = model.forward(_ids(tokens[-1:] + proposal.tokens, model.device), cache, k + 1)
        stats.model_seconds += time.perf_counter() - t
        stats.model_forward_passes += 1
        if want_prompt_logits is not None:
            prompt_logits = logits[0, 0].clone()
            want_prompt_logits = None
        logits = apply_filters(filters, _ids(tokens + proposal.tokens, model.device), logits)[0]

        # 4. Accept: the agreeing prefix plus the model's own token (or speculative sampling).
        if sampling.greedy:
            accepted, kept, kept_logprobs = greedy_accept(logits, proposal.tokens)
        else:
            probs = sampling_probs(logits, sampling)
            accepted, kept = speculative_accept(probs, proposal.probs if k else None, proposal.tokens, generator)
            kept_logprobs = _logprobs(logits, kept)

        # 5. Limits: stop at the first end-of-sequence token or the length limit.
        end = next((i + 1 for i, tok in enumerate(kept) if tok in eos), None)
        if end is not None:
            kept, kept_logprobs, finished = kept[:end], kept_logprobs[:end], True
        kept = kept[: limit - len(new_tokens)]
        tokens = tokens + kept
        new_tokens += kept
        logprobs += kept_logprobs[: len(kept)]
        accepted = min(accepted, len(kept))
        stats.rounds += 1
        stats.drafted_tokens += k
        stats.accepted_tokens += accepted
        if draft is not None:
            stats.accepted_length_histogram[accepted] += 1
            stats.draft_lengths.append(k)
        if finished or len(new_tokens) >= limit:
            break

        # 6. Roll back: both caches keep only what was accepted.
        model.crop(cache, len(tokens) - 1)
        if draft is not None:
            draft.update(tokens, accepted)
            schedule.update(k, accepted)

    stats.generated_tokens = len(new_tokens)
    stats.total_seconds = time.perf_counter() - start
    return GenerationResult(new_tokens, logprobs, stats, finished, prompt_logits)


def _ids(tokens: Sequence[int], device: torch.device) -> torch.Tensor:
    return torch.tensor([list(tokens)], dtype=torch.long, device=device)


def _logprobs(logits: torch.Tensor, tokens: list[int]) -> list[float]:
    rows = torch.arange(len(tokens), device=logits.device)
    ids = torch.tensor(tokens, dtype=torch.long, device=logits.device)
    return torch.log_softmax(logits[: len(tokens)].float(), dim=-1)[rows, ids].tolist()
