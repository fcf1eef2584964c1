"""Logit filters and the sampling transform, applied identically to the model and the assistant.

A filter sees the whole token context and the logits of the last `P` positions at once, so a round of `k`
drafts is filtered in one call rather than once per checked position.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

import torch


class LogitsFilter(Protocol):
    """Masks or reshapes logits given the tokens before each position."""

    def apply(self, tokens: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        """Filters logits of the last positions.

        Args:
            tokens: `[1, L]` every token so far, drafts included.
            logits: `[1, P, V]`; row `j` predicts position `L - P + 1 + j`, so its context is
                `tokens[:, : L - P + 1 + j]`.

        Returns:
            The filtered logits, same shape (may be modified in place).
        """


class SuppressTokens:
    """Sets the given token ids to -inf at every position."""

    def __init__(self, token_ids: Sequence[int]) -> None:
        self.token_ids = torch.tensor(sorted(set(token_ids)), dtype=torch.long)

    def apply(self, tokens: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        if self.token_ids.numel():
            ids = self.token_ids.to(logits.device)
            logits[..., ids[ids < logits.shape[-1]]] = -torch.inf
        return logits


def apply_filters(filters: Sequence[LogitsFilter], tokens: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """Runs every filter in order."""
    for f in filters:
        logits = f.apply(tokens, logits)
    return logits


@dataclass(frozen=True)
class SamplingOptions:
    """How a token is chosen from filtered logits."""

    # 0 means greedy (argmax); above 0, sample from softmax(logits / temperature).
    temperature: float = 0.0
    # Keep only the k most likely tokens before sampling (None: all).
    top_k: int | None = None
    # Keep the smallest set of tokens whose probability reaches top_p (None: all).
    top_p: float | None = None

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k is not None and self.top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {self.top_k}")
        if self.top_p is not None and not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def sampling_probs(logits: torch.Tensor, options: SamplingOptions) -> torch.Tensor:
    """Turns filtered logits into the distribution that sampling draws from.

    Temperature, then top-k, then top-p (nucleus), the order transformers uses. The same function is applied to
    the model and the assistant so speculative sampling compares like with like.

    Args:
        logits: `[..., V]` filtered logits.
        options: a sampling (temperature > 0) configuration.

    Returns:
        `[..., V]` float32 probabilities summing to 1.
    """
    logits = logits.float() / options.temperature
    if options.top_k is not None and options.top_k < logits.shape[-1]:
        kth = torch.topk(logits, options.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, -torch.inf)
    if options.top_p is not None and options.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        cumulative = sorted_logits.softmax(-1).cumsum(-1)
        # Drop a token when the tokens before it already reach top_p; the most likely token always stays.
        drop_sorted = (cumulative - sorted_logits.softmax(-1)) >= options.top_p
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, -torch.inf)
    return logits.softmax(-1)
