"""Verification: which drafted tokens the model keeps, and its own next token.

Each function does its work on the device and reads back to the host once.
"""

from __future__ import annotations

import torch


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
        best_logprob = torch.log_softmax(row_logits.float(), dim=-1).max(-1).values
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
