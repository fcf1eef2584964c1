"""How many tokens the assistant drafts each round."""

from __future__ import annotations

from typing import Protocol

SCHEDULES = ("heuristic", "constant", "confidence")


class DraftSchedule(Protocol):
    """Chooses k before a round and learns from its outcome."""

    # Stop drafting early when the assistant's top probability falls below this (None: never).
    min_confidence: float | None

    def next_k(self) -> int:
        """Number of tokens to draft in the coming round (>= 1)."""

    def update(self, drafted: int, accepted: int) -> None:
        """Records how many of the drafted tokens the model accepted."""


class ConstantSchedule:
    """Always k drafts."""

    min_confidence: float | None = None

    def __init__(self, k: int = 5) -> None:
        self.k = k

    def next_k(self) -> int:
        return self.k

    def update(self, drafted: int, accepted: int) -> None:
        pass


class HeuristicSchedule(ConstantSchedule):
    """The seeds' rule: start at k, +2 after a round where all drafts were accepted, -1 otherwise, at least 1."""

    def update(self, drafted: int, accepted: int) -> None:
        if drafted == 0:
            return
        self.k = self.k + 2 if accepted == drafted else max(1, self.k - 1)


class ConfidenceSchedule(ConstantSchedule):
    """Up to k drafts, stopping as soon as the assistant's top probability falls below a threshold."""

    def __init__(self, k: int = 10, threshold: float = 0.4) -> None:
        super().__init__(k)
        self.min_confidence = threshold


def make_schedule(name: str, k: int, threshold: float = 0.4) -> DraftSchedule:
    """Builds a schedule by name.

    Raises:
        ValueError: for an unknown name or k < 1.
    """
    if k < 1:
        raise ValueError(f"the number of assistant tokens must be >= 1, got {k}")
    if name == "heuristic":
        return HeuristicSchedule(k)
    if name == "constant":
        return ConstantSchedule(k)
    if name == "confidence":
        if not 0.0 < threshold < 1.0:
            raise ValueError(f"the confidence threshold must be in (0, 1), got {threshold}")
        return ConfidenceSchedule(k, threshold)
    raise ValueError(f"unknown schedule {name!r}; choose one of {', '.join(SCHEDULES)}")
