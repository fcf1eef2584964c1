"""Paired bootstrap intervals for WER differences between two configurations on the same items.

Items are resampled with replacement (the same draw for both configurations, so each item's difficulty
cancels); each resample's WER difference is (errors of B - errors of A) / reference words over the drawn items.
The 2.5th and 97.5th percentiles of 1,000 resamples give the 95 % interval (Koehn 2004, Bisani and Ney 2004).
An interval that holds 0 means the difference is within what the choice of items alone would give.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

RESAMPLES = 1000


def paired_interval(errors_a: Sequence[int], errors_b: Sequence[int], words: Sequence[int],
                    resamples: int = RESAMPLES, seed: int = 0, level: float = 0.95) -> tuple[float, float] | None:
    """The `level` interval of WER(B) - WER(A) over items scored by both (per-item edit counts and reference
    lengths, in the same order); None for fewer than two items or no reference words."""
    a, b, n = (np.asarray(x, dtype=np.float64) for x in (errors_a, errors_b, words))
    if len(n) < 2 or n.sum() == 0:
        return None
    draws = np.random.default_rng(seed).integers(0, len(n), size=(resamples, len(n)))
    totals = n[draws].sum(axis=1)
    differences = ((b - a)[draws].sum(axis=1) / np.maximum(totals, 1))[totals > 0]
    tail = (1 - level) / 2 * 100
    low, high = np.percentile(differences, [tail, 100 - tail])
    return float(low), float(high)
