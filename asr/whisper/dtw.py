"""Dynamic time warping of a window's tokens onto its audio frames, compiled by numba (librosa's dependency).

The same path as openai-whisper's `timing.dtw_cpu` and transformers' `_dynamic_time_warping` (which word timestamps
used before): costs summed in float32 in the same order, the same choice on ties, so the same indices. Those run
the cell loop in Python in transformers (150 ms for 86 tokens over a 30 s window, 28 ms for 40 tokens over 15 s:
more than the alignment pass itself, on every window with word timestamps and every live update); compiled, well
under a millisecond. Compiled at first use and cached on disk by numba (`cache=True`): about a second, once.
"""

from __future__ import annotations

import functools

import numpy as np


def dynamic_time_warping(matrix: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The cheapest monotonic path through `matrix` (`[tokens, frames]`, float64 costs) from its first cell to its
    last: the token index and the frame index of each step, in order."""
    matrix = np.ascontiguousarray(matrix, dtype=np.float64)
    if matrix.ndim != 2 or matrix.shape[0] == 0 or matrix.shape[1] == 0:
        raise ValueError(f"a cost matrix needs at least one token and one frame, got shape {matrix.shape}")
    path = _compiled()(matrix)
    return path[0], path[1]


@functools.lru_cache(maxsize=None)
def _compiled():
    import numba

    @numba.njit(cache=True)
    def warp(x: np.ndarray) -> np.ndarray:
        n, m = x.shape
        cost = np.full((n + 1, m + 1), np.inf, dtype=np.float32)
        trace = np.full((n + 1, m + 1), -1, dtype=np.int8)
        cost[0, 0] = 0
        for j in range(1, m + 1):
            for i in range(1, n + 1):
                c0, c1, c2 = cost[i - 1, j - 1], cost[i - 1, j], cost[i, j - 1]
                # openai-whisper's order: the diagonal only when strictly cheapest, then up, else left.
                if c0 < c1 and c0 < c2:
                    c, t = c0, 0
                elif c1 < c0 and c1 < c2:
                    c, t = c1, 1
                else:
                    c, t = c2, 2
                cost[i, j] = np.float32(x[i - 1, j - 1] + np.float64(c))  # summed in float64, kept in float32
                trace[i, j] = t
        trace[0, :] = 2
        trace[:, 0] = 1
        steps = np.empty((2, n + m), dtype=np.int64)
        i, j, count = n, m, 0
        while i > 0 or j > 0:
            steps[0, count], steps[1, count] = i - 1, j - 1
            count += 1
            if trace[i, j] == 0:
                i -= 1
                j -= 1
            elif trace[i, j] == 1:
                i -= 1
            else:
                j -= 1
        return steps[:, :count][:, ::-1].copy()

    return warp
