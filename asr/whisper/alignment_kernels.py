"""The numeric loops of word alignment, compiled by numba (librosa's dependency): the median filter of the
alignment heads' weights and the dynamic time warping of the tokens onto the frames.

Both give exactly what openai-whisper's `timing.py` and transformers (`_median_filter`, `_dynamic_time_warping`,
which word timestamps used before) give: a median is one of its inputs whatever the order it is found in, and the
warping sums its costs in float32 in the same order and breaks ties the same way. transformers sorts every window of
values for the median (52-57 ms over a 28 s window's 8 heads and 82 tokens) and runs the warping's cell loop in
Python (108-150 ms for ~85 tokens over a 30 s window, 28 ms for 40 tokens over 15 s): together more than the
alignment pass itself, on every window with word timestamps and every live update. Compiled: under 1 ms and ~2 ms
(docs/figures/alignment-xeon.md). Compiled at first use and cached on disk by numba (`cache=True`): seconds, once
a machine; loading them costs a process ~0.4 s (numba's import and its cache), more than a short clip's window
takes in transformers' loops, so windows under `COMPILED_FROM_CELLS` keep those until the compiled ones are loaded
(`load()`: a live stream and the server load them before audio arrives).
"""

from __future__ import annotations

import functools

import numpy as np


# Tokens x frames from which a window's loops load the compiled ones (transformers' take ~50 ms there, about 12 s
# of speech; a 30 s window has ~130,000).
COMPILED_FROM_CELLS = 40_000


def load() -> None:
    """Loads the compiled loops now (compiling them at the first use on a machine)."""
    _kernels()


def loaded() -> bool:
    """Whether the compiled loops are loaded in this process."""
    return _kernels.cache_info().currsize > 0


def median_filter(values: np.ndarray, width: int) -> np.ndarray:
    """The median of each `width` (odd) consecutive values along the last axis of a 3-dimensional float32 array, the
    edges reflected (`torch.nn.functional.pad`'s "reflect": the edge value is not repeated), NaN sorted last as
    torch sorts it. An axis of at most `width // 2` values comes back as it is."""
    if width <= 0 or width % 2 != 1:
        raise ValueError(f"the median filter's width must be an odd number, got {width}")
    values = np.ascontiguousarray(values, dtype=np.float32)
    if values.ndim != 3:
        raise ValueError(f"the median filter takes a 3-dimensional array, got shape {values.shape}")
    pad = width // 2
    if values.shape[-1] <= pad:
        return values.copy()
    if width == 7 and _compiled_for(values.shape[-2] * values.shape[-1]) and not np.isnan(values).any():
        return _kernels()[0](values)  # Whisper's width; the network's min and max would not order NaN as sorting does
    padded = np.pad(values, ((0, 0), (0, 0), (pad, pad)), mode="reflect")
    return np.sort(np.lib.stride_tricks.sliding_window_view(padded, width, axis=-1), axis=-1)[..., pad]


def dynamic_time_warping(matrix: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The cheapest monotonic path through `matrix` (`[tokens, frames]`, float64 costs) from its first cell to its
    last: the token index and the frame index of each step, in order."""
    matrix = np.ascontiguousarray(matrix, dtype=np.float64)
    if matrix.ndim != 2 or matrix.shape[0] == 0 or matrix.shape[1] == 0:
        raise ValueError(f"a cost matrix needs at least one token and one frame, got shape {matrix.shape}")
    if not _compiled_for(matrix.size):
        from transformers.models.whisper.generation_whisper import _dynamic_time_warping

        return _dynamic_time_warping(matrix)
    path = _kernels()[1](matrix)
    return path[0], path[1]


def _compiled_for(cells: int) -> bool:
    return cells >= COMPILED_FROM_CELLS or loaded()


@functools.lru_cache(maxsize=None)
def _kernels():
    import numba

    @numba.njit(cache=True)
    def median7(x: np.ndarray) -> np.ndarray:
        a, b, n = x.shape
        out = np.empty_like(x)
        row = np.empty(n + 6, dtype=np.float32)
        for i in range(a):
            for j in range(b):
                row[3:n + 3] = x[i, j]
                for p in range(3):  # reflected edges
                    row[2 - p] = x[i, j, p + 1]
                    row[n + 3 + p] = x[i, j, n - 2 - p]
                for t in range(n):
                    v0, v1, v2, v3, v4, v5, v6 = row[t], row[t + 1], row[t + 2], row[t + 3], row[t + 4], row[t + 5], \
                        row[t + 6]
                    # A sorting network for 7 values (16 comparators, Knuth TAOCP 5.3.4); the median is the 4th.
                    v0, v6 = min(v0, v6), max(v0, v6)
                    v2, v3 = min(v2, v3), max(v2, v3)
                    v4, v5 = min(v4, v5), max(v4, v5)
                    v0, v2 = min(v0, v2), max(v0, v2)
                    v1, v4 = min(v1, v4), max(v1, v4)
                    v3, v6 = min(v3, v6), max(v3, v6)
                    v0, v1 = min(v0, v1), max(v0, v1)
                    v2, v5 = min(v2, v5), max(v2, v5)
                    v3, v4 = min(v3, v4), max(v3, v4)
                    v1, v2 = min(v1, v2), max(v1, v2)
                    v4, v6 = min(v4, v6), max(v4, v6)
                    v2, v3 = min(v2, v3), max(v2, v3)
                    v4, v5 = min(v4, v5), max(v4, v5)
                    v1, v2 = min(v1, v2), max(v1, v2)
                    v3, v4 = min(v3, v4), max(v3, v4)
                    v5, v6 = min(v5, v6), max(v5, v6)
                    out[i, j, t] = v3
        return out

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

    return median7, warp
