"""Statistics that every generation result carries."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any


@dataclass
class GenerationStats:
    """What one generation (or a sum of several) did and cost."""

    # Tokens added after the prompt, end-of-sequence included.
    generated_tokens: int = 0
    # Forward passes of the large model (prefill included).
    model_forward_passes: int = 0
    # Forward passes of the assistant model (0 without one, and for prompt lookup).
    assistant_forward_passes: int = 0
    # Tokens proposed by the draft source and checked by the model.
    drafted_tokens: int = 0
    # Drafted tokens the model kept.
    accepted_tokens: int = 0
    # Verification rounds: one model pass each.
    rounds: int = 0
    # Accepted drafts per round -> number of rounds.
    accepted_length_histogram: Counter = field(default_factory=Counter)
    # Number of drafts proposed in each round (the schedule's k, cut by the limits).
    draft_lengths: list[int] = field(default_factory=list)
    # Wall time in the model's and the assistant's forward passes, and in the whole call.
    model_seconds: float = 0.0
    assistant_seconds: float = 0.0
    total_seconds: float = 0.0

    @property
    def acceptance_rate(self) -> float:
        """Accepted / drafted tokens (0 when nothing was drafted)."""
        return self.accepted_tokens / self.drafted_tokens if self.drafted_tokens else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Tokens added per model verification round (accepted drafts plus the model's own token)."""
        return self.generated_tokens / self.rounds if self.rounds else 0.0

    def add(self, other: "GenerationStats") -> None:
        """Accumulates another result's statistics into this one."""
        for name in ("generated_tokens", "model_forward_passes", "assistant_forward_passes", "drafted_tokens",
                     "accepted_tokens", "rounds", "model_seconds", "assistant_seconds", "total_seconds"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.accepted_length_histogram.update(other.accepted_length_histogram)
        self.draft_lengths.extend(other.draft_lengths)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dictionary (the per-round k list is summarised as its mean)."""
        return {
            "generated_tokens": self.generated_tokens,
            "model_forward_passes": self.model_forward_passes,
            "assistant_forward_passes": self.assistant_forward_passes,
            "drafted_tokens": self.drafted_tokens,
            "accepted_tokens": self.accepted_tokens,
            "acceptance_rate": round(self.acceptance_rate, 4),
            "rounds": self.rounds,
            "mean_accepted_length": round(self.mean_accepted_length, 4),
            "accepted_length_histogram": {str(k): v for k, v in sorted(self.accepted_length_histogram.items())},
            "mean_draft_length": round(sum(self.draft_lengths) / len(self.draft_lengths), 4)
            if self.draft_lengths else 0.0,
            "model_seconds": round(self.model_seconds, 4),
            "assistant_seconds": round(self.assistant_seconds, 4),
            "total_seconds": round(self.total_seconds, 4),
        }
