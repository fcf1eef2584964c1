"""A decoder's steps on a GPU as replayed CUDA graphs.

On a GPU a decoder step of a few tokens is some thirty kernels a layer, and launching them from Python takes
longer than running them (large-v3's step: 12.3 ms at batch 1 through the layers, docs/benchmarks.md). A CUDA
graph records one step's kernels once and launches them all again with one call. A graph reads and writes fixed
addresses, so a model's steps run over sets of buffers kept with the model (`GraphedSteps`), each for a number of
rows: key/value buffers of the model's whole length (448 slots; self-attention runs over all of them with the
slots past each token masked, which weigh nothing), the cross-attention keys and values of the windows being
decoded (copied in when the windows change), the new tokens, the step's first slot, the mask and positions of a
ragged batch, and the logits. A graph per width (new tokens, up to `MAX_WIDTH`) and mask kind is captured over a
set the first time a step needs it and kept, so every window of every recording replays it.

A cache takes a set at `new_cache` when one is free (its last cache gone): the smallest for at least its rows and
at most twice as many (its rows at the front, the others computed and ignored), else a new one; at most
`MAX_SETS` are kept (a model and an identical assistant, a decode and its fallback, at once), a free one
dropped to make room. Rows leaving the batch move to the front of the same buffers; beams widening it, to a set
for that many rows. The prompt pass, wider steps and any pass over a cache without a set's buffers run through
the layers as before (the same kernels, launched one by one). The capture's replay and the next one of every graph
are checked against the layers' pass: a difference beyond rounding, or a capture that fails, turns the model's
graphs off with a warning, so a wrong graph costs speed, never words.

`ASSISTED_WHISPER_CUDA_GRAPHS=0` turns graphs off. On a CPU there are none; within `captured_by(capture)` the same
steps run there over the same buffers, `capture` standing in for a graph's capture: the tests give one that records
the step's operations as it runs them once and a replay that runs those operations again over the same tensors,
every result written where the capture's was (what a graph does, host values and all), and so check on a CPU what
a replay computes.
"""

from __future__ import annotations

import contextlib
import contextvars
import copy
import logging
import os
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch

from decoding.kv_cache import StaticKVCache, causal_mask

# Widest step a graph is captured for: a check of up to 15 drafts. Wider passes go through the layers.
MAX_WIDTH = 16
# Buffer sets kept per model (each holds the model's whole key/value length for its rows, and its graphs).
MAX_SETS = 4
# Replays of each graph checked against the layers' pass (the capture's own and the next, at another slot).
CHECKED_RUNS = 2

log = logging.getLogger(__name__)

_ENABLED = os.environ.get("ASSISTED_WHISPER_CUDA_GRAPHS", "1") != "0"
# What stands in for a CUDA graph's capture off a GPU (`captured_by`), or None: no graphs there.
Capture = Callable[[Callable[[], None]], Callable[[], None]]
_CAPTURE: contextvars.ContextVar[Capture | None] = contextvars.ContextVar("capture", default=None)
_STEPS: "weakref.WeakKeyDictionary[torch.nn.Module, GraphedSteps]" = weakref.WeakKeyDictionary()


@contextlib.contextmanager
def captured_by(capture: Capture) -> Iterator[None]:
    """Within it, adapters built off a GPU step over the graphs' buffers too, `capture(run)` standing in for a
    graph's capture of a step (`run`, a function of nothing but those buffers) and returning its replay; for tests,
    which check on a CPU what a replay computes."""
    token = _CAPTURE.set(capture)
    try:
        yield
    finally:
        _CAPTURE.reset(token)


def graphed_steps(adapter: Any) -> "GraphedSteps | None":
    """The graphs of `adapter`'s model (a `WhisperDecoderAdapter`), or None where they do not apply: not on a
    GPU (outside `captured_by()`), turned off, an offloaded decoder (its weights move every pass), or a decoder
    over a fixed span of slots (the int8 model, CPU only)."""
    if not _ENABLED or adapter.store is not None or adapter.span is not None:
        return None
    capture = _CAPTURE.get()
    if adapter.device.type != "cuda" and capture is None:
        return None
    steps = _STEPS.get(adapter.model)
    if steps is None or steps.device != adapter.device:
        steps = _STEPS[adapter.model] = GraphedSteps(adapter.device, capture)
    return steps


@dataclass
class _Step:
    """One captured step: its inputs, its output and how to run it."""

    ids: torch.Tensor  # [B, W]
    positions: torch.Tensor | None  # [B, W], ragged batches only
    mask: torch.Tensor | None  # [B, 1, W, capacity] boolean, ragged batches only
    logits: torch.Tensor  # [B, W, V] float32
    run: Callable[[], None]
    checks_left: int = CHECKED_RUNS


class _Buffers:
    """A set of buffers for `batch_size` rows (key/value, cross-attention, first slot) and the steps captured over
    them."""

    def __init__(self, adapter: Any, batch_size: int) -> None:
        cache = StaticKVCache.empty(len(adapter.layers), batch_size, adapter.heads, adapter.head_dim,
                                    adapter.max_length, adapter.kv_dtype, adapter.device)
        self.keys, self.values = cache.keys, cache.values
        self.batch_size = batch_size
        self.start = torch.zeros((), dtype=torch.long, device=adapter.device)
        self.cross: list[tuple[torch.Tensor, torch.Tensor]] | None = None
        self.cross_version: int | None = None
        self.steps: dict[tuple[int, bool], _Step] = {}
        # The cache using these buffers, and the views of them it was given (rows leaving make new views).
        self.owner: weakref.ref | None = None
        self.lent: torch.Tensor | None = None

    def free(self) -> bool:
        owner = self.owner() if self.owner is not None else None
        return owner is None or owner.keys is not self.lent

    def lend(self, cache: StaticKVCache, rows: int) -> None:
        cache.keys, cache.values = self.keys[:, :rows], self.values[:, :rows]
        self.owner, self.lent = weakref.ref(cache), cache.keys

    def load_cross(self, adapter: Any) -> bool:
        """Copies `adapter`'s cross-attention keys and values in (the rows it has) when they are not there yet;
        False where their shapes differ from the buffers' (another encoder length)."""
        if self.cross_version == adapter.cross_version:
            return True
        if self.cross is None:
            # Zeros, not garbage, in rows no window fills: their (ignored) attention stays finite.
            self.cross = [tuple(x.new_zeros((self.batch_size, *x.shape[1:])) for x in pair) for pair in adapter.cross]
        rows = adapter.batch_size
        pairs = [(x, y) for pair, mine in zip(adapter.cross, self.cross) for x, y in zip(pair, mine)]
        if rows > self.batch_size or any(x.shape[1:] != y.shape[1:] for x, y in pairs):
            return False
        for x, y in pairs:
            y[:rows].copy_(x)
        self.cross_version = adapter.cross_version
        return True


class GraphedSteps:
    """A model's decoder steps as CUDA graphs over buffers kept with the model (see the module's docstring)."""

    def __init__(self, device: torch.device, capture: Capture | None = None) -> None:
        self.device = device
        self.capture = capture  # off a GPU: what stands in for a graph's capture (`captured_by`)
        self.enabled = True  # off for good after a capture fails or a replay disagrees with the layers
        self.buffers: list[_Buffers] = []
        self.pool = torch.cuda.graph_pool_handle() if device.type == "cuda" else None

    def new_cache(self, adapter: Any, batch_size: int) -> StaticKVCache | None:
        """A cache over a free set of buffers for `batch_size` rows, or None when every set is in use."""
        buffers = self._free(adapter, batch_size)
        if buffers is None:
            return None
        cache = StaticKVCache(buffers.keys, buffers.values)
        buffers.lend(cache, batch_size)
        return cache

    def _free(self, adapter: Any, rows: int) -> _Buffers | None:
        """A free set for `rows` rows: the smallest holding them and at most twice as many, else a new one (a free
        set dropped to make room), else the smallest free one holding them."""
        if not self.enabled:
            return None
        free = sorted((b for b in self.buffers if b.free() and b.batch_size >= rows), key=lambda b: b.batch_size)
        if free and free[0].batch_size <= 2 * rows:
            return free[0]
        if len(self.buffers) >= MAX_SETS:
            unused = [b for b in self.buffers if b.free()]
            if not unused:
                return free[0] if free else None
            self.buffers.remove(min(unused, key=lambda b: b.batch_size))
        buffers = _Buffers(adapter, rows)
        self.buffers.append(buffers)
        return buffers

    def _owning(self, cache: StaticKVCache) -> _Buffers | None:
        return next((b for b in self.buffers if b.lent is cache.keys and not b.free()), None)

    def select(self, adapter: Any, cache: StaticKVCache, rows: torch.Tensor) -> bool:
        """Keeps `rows` of a cache over these buffers (a row given twice is copied): in the first rows of the same
        buffers, or of a free set for that many rows when they outnumber them (beams widening a batch). False
        where the cache is not over buffers of these graphs, and the caller selects as it would without them."""
        source = self._owning(cache)
        if source is None:
            return False
        count = len(rows)
        target = source if count <= source.batch_size else self._free(adapter, count)
        if target is None:
            return False
        # Gathered first: a row may move onto a row that is itself still to be read.
        keys, values = cache.keys.index_select(1, rows), cache.values.index_select(1, rows)
        target.keys[:, :count].copy_(keys)
        target.values[:, :count].copy_(values)
        target.lend(cache, count)
        return True

    def forward(self, adapter: Any, input_ids: torch.Tensor, cache: StaticKVCache, start: int, num_logits: int,
                attention_mask: torch.Tensor | None, position_ids: torch.Tensor | None) -> torch.Tensor | None:
        """`adapter.forward`'s logits `[B, num_logits, V]` through a graph, or None where none applies (the caller
        runs the layers): the prompt, a step wider than `MAX_WIDTH` or past the buffers, a cache not over them."""
        rows, width = input_ids.shape
        masked = attention_mask is not None or position_ids is not None
        if not self.enabled or start == 0 or width > MAX_WIDTH or start + width > adapter.max_length \
                or masked and (attention_mask is None or position_ids is None or attention_mask.dtype != torch.bool):
            return None
        buffers = self._owning(cache)
        if buffers is None or not buffers.load_cross(adapter):
            return None
        step = buffers.steps.get((width, masked))
        fresh = step is None
        if fresh:
            step = buffers.steps[(width, masked)] = self._step(adapter, buffers, width, masked)
        # The inputs first: a fresh graph's warm-up runs compute this very step.
        step.ids[:rows].copy_(input_ids)
        buffers.start.fill_(start)
        if masked:
            end = start + width
            step.positions[:rows].copy_(position_ids)
            step.mask[:rows, :, :, :end].copy_(attention_mask)
            step.mask[:rows, :, :, end:].fill_(False)
        if not step.checks_left:
            step.run()
            # A copy: the next replay overwrites the buffer while a caller may still hold these (a draft's logits).
            return step.logits[:rows, width - num_logits:].clone()
        # A capture, and the replay after it, are checked against the layers' pass: the cache is put back as it
        # was before the replay (which could have written any slot), and the layers' pass writes it.
        step.checks_left -= 1
        saved = cache.keys.clone(), cache.values.clone()
        failed = None
        if fresh:
            try:
                step.run = self._capture(step.run)
            except RuntimeError as error:
                failed = f"capturing a step of {width} tokens for {rows} rows failed ({error})"
        if failed is None:
            step.run()
            replayed = step.logits[:rows].clone()
        cache.keys.copy_(saved[0])
        cache.values.copy_(saved[1])
        expected = adapter.pass_through_layers(input_ids, cache, start, width, attention_mask, position_ids,
                                               native_step=False)
        if failed is None and not _close(replayed, expected, adapter.dtype):
            failed = f"a replayed step of {width} tokens for {rows} rows differs from the layers' pass"
        if failed is not None:
            log.warning("CUDA graphs turned off for this model: %s; its steps run through the layers", failed)
            self.enabled = False
        return expected[:, width - num_logits:]

    def _step(self, adapter: Any, buffers: _Buffers, width: int, masked: bool) -> _Step:
        """A step of `width` tokens over `buffers` as a function of nothing but buffers (what a graph records)."""
        batch, device, capacity = buffers.batch_size, self.device, adapter.max_length
        runner = copy.copy(adapter)
        runner.cross = buffers.cross
        runner.model = None  # the graphs are kept in a weak mapping keyed by the model: no reference back to it
        cache = StaticKVCache(buffers.keys, buffers.values)
        offsets = torch.arange(width, device=device)
        ids = torch.zeros(batch, width, dtype=torch.long, device=device)
        logits = torch.empty(batch, width, adapter.vocab_size, dtype=torch.float32, device=device)
        # Rows behind a shrunk batch keep an all-visible mask: their (ignored) softmax stays finite.
        mask = torch.ones(batch, 1, width, capacity, dtype=torch.bool, device=device) if masked else None
        positions = torch.zeros(batch, width, dtype=torch.long, device=device) if masked else None

        def run() -> None:
            slots = buffers.start + offsets
            if masked:
                attend, where = mask, positions
            else:
                attend = causal_mask(buffers.start, width, device, slots=capacity)
                where = slots.expand(batch, width)
            x = runner.embed(ids, where)
            x = runner.layers_over(x, cache, slots, attend)
            logits.copy_(runner.proj_out(runner.layer_norm(x)).float())

        return _Step(ids, positions, mask, logits, run)

    def _capture(self, run: Callable[[], None]) -> Callable[[], None]:
        """`run` recorded as a CUDA graph (after warm-up runs on a side stream, as CUDA graphs require), or `run`
        what stands in for the capture outside a GPU (`captured_by`)."""
        if self.device.type != "cuda":
            return self.capture(run)
        # On the model's device, whichever is current (a process of `accelerate launch` may hold several).
        with torch.cuda.device(self.device):
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(2):
                    run()
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            # thread_local: a reader thread allocating memory meanwhile (audio loading) does not break the capture.
            with torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"):
                run()

        def replay() -> None:
            with torch.cuda.device(self.device):
                graph.replay()
        return replay


def _close(logits: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> bool:
    """Whether a graph's logits are the layers' up to the rounding of attention over more (masked) slots, for a
    decoder computing in `dtype`: within 0.01 % of the logits' largest magnitude in float32 (a hundred times the
    difference the masked slots make on a CPU), 5 % in half precision. A tiny random decoder, which hardly depends
    on positions, was off by 0.09 % with its mask left at the capture's slot, and 0.9 % reading its token at a
    wrong slot; a real one is off by far more.
    Infinite logits (a draft's head over a subset of the vocabulary) must be the same."""
    finite = torch.isfinite(expected)
    if not torch.equal(torch.where(finite, 0.0, expected), torch.where(finite, 0.0, logits)):
        return False
    if not bool(finite.any()):
        return True
    scale = float(expected[finite].abs().max()) + 1.0
    tolerance = 1e-4 if dtype == torch.float32 else 5e-2
    return float((logits[finite] - expected[finite]).abs().max()) <= tolerance * scale
