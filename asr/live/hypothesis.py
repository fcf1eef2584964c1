"""The last hypothesis as a draft: a window assistant whose drafts come from the previous decode of the same
audio (`decoding.ReferenceDraft`), then from an assistant where that runs out."""

from __future__ import annotations

from typing import Callable, Sequence

from asr.whisper.window import WindowContext
from decoding import DraftSource, ReferenceDraft

# Tokens a round may draft from the last hypothesis: most of them are kept, and on a CPU a check's cost grows
# slowly past a few tokens. Longer rounds gained nothing once a check of any width was one native call (2026-12-06,
# `base`, AMD EPYC, stepped sonnets: decoder 24.4 s with rounds of 23, 24.9 / 25.1 / 25.1 s with 31 / 47 / 63).
REFERENCE_K = 23


class HypothesisAssistant:
    """Drafts `reference` (the last hypothesis's tokens, timestamps moved to this buffer's start), then what
    `inner` drafts (None: nothing) where the new decode leaves it.

    Args:
        reference: the tokens the last decode generated (end-of-text excluded).
        inner: the run's assistant for the new audio at the end of the buffer, or None.
        inner_k: most tokens the inner assistant drafts a round.
    """

    chosen_by_auto = False
    expected_speedup = None

    def __init__(self, reference: Sequence[int], inner=None, inner_k: int = 5) -> None:
        self.reference = list(reference)
        self.inner = inner
        self.inner_k = inner_k
        self.name = "hypothesis" + (f"+{inner.name}" if inner is not None else "")
        self.schedule = ("constant", REFERENCE_K)

    def prepare(self, windows: list[WindowContext]) -> tuple[Callable[[list[int]], DraftSource], float]:
        inner_make, seconds = self.inner.prepare(windows) if self.inner is not None else (None, 0.0)

        def make_draft(rows: list[int]) -> DraftSource:
            return ReferenceDraft(self.reference, inner_make(rows) if inner_make is not None else None,
                                  self.inner_k)

        return make_draft, seconds


def segment_boundaries(tokens: Sequence[int], timestamp_begin: int) -> list[int]:
    """Where one segment ends and the next starts: each index j of two timestamps in a row (j and j + 1)."""
    return [j for j in range(len(tokens) - 1) if tokens[j] >= timestamp_begin and tokens[j + 1] >= timestamp_begin]


def moved_reference(tokens: Sequence[int], cut: float, timestamp_begin: int) -> list[int]:
    """The tokens after the segment that ends at `cut` seconds, their timestamps moved back by `cut`: what a
    decode of the buffer trimmed at `cut` is expected to say. Empty where no segment ends there."""
    step = round(cut / 0.02)
    for j in segment_boundaries(tokens, timestamp_begin):
        if tokens[j] - timestamp_begin == step:
            return [t - step if t >= timestamp_begin else t for t in tokens[j + 1:]]
    return []


def joined_windows(windows: Sequence[Sequence[int]], seeks: Sequence[float], timestamp_begin: int) -> list[int]:
    """The tokens of a buffer's windows as one sequence, each window's timestamps moved by where it starts
    (`seeks`, seconds, one per window): what a decode of the whole buffer would say in one window."""
    joined: list[int] = []
    for tokens, seek in zip(windows, seeks):
        step = round(seek / 0.02)
        moved = [t + step if t >= timestamp_begin else t for t in tokens]
        if joined and moved and moved[0] == joined[-1]:
            moved = moved[1:]  # the first window's last timestamp is where the second starts
        joined += moved
    return joined
