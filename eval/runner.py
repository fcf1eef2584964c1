"""Runs every configuration over the same items, interleaved, after a warm-up.

Item by item, each configuration decodes the same samples in turn (the order rotates from item to item), so
drift of the machine (other jobs, clocks, caches) hits every configuration alike. Before anything is counted,
the first readable item goes once through every configuration: first calls pay for lazy initialisation.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

from asr.errors import first_line
from audio.constants import SAMPLE_RATE
from eval.backends.decoded import Backend, Decoded
from eval.configs import EvalConfig

logger = logging.getLogger(__name__)


@dataclass
class EvalItem:
    """One input item, as the evaluation saw it."""

    id: str
    # Where the audio came from (path or name), for messages.
    display: str
    # Reference transcript (None: the source had none, so the item counts for latency only).
    reference: str | None
    subset: str | None
    # Language the item is decoded and scored in (None: detected).
    language: str | None
    audio_seconds: float = 0.0
    # Why the item could not be decoded at all (bad manifest line, unreadable audio); None when it could.
    error: str | None = None


@dataclass(frozen=True)
class Failure:
    """A configuration that failed on one item, with the one-line reason."""

    message: str


@dataclass
class EvalRun:
    """Everything an evaluation measured; `results[name][i]` belongs to `items[i]` (None: item not decodable)."""

    configs: list[EvalConfig]
    items: list[EvalItem] = field(default_factory=list)
    results: dict[str, list[Decoded | Failure | None]] = field(default_factory=dict)
    # Configurations that could not run here, with the reason.
    skipped: dict[str, str] = field(default_factory=dict)
    # Id of the warm-up item (decoded once by every configuration, not counted), or None.
    warmup_item: str | None = None
    # Items decoded together (1: one at a time, each timed on its own).
    batch_size: int = 1


def run_interleaved(items: Iterable, backends: Sequence[Backend], *, language: str | None = None,
                    limit: int | None = None, warmup: bool = True,
                    on_item: Callable[[EvalItem, dict[str, Decoded | Failure | None]], None] | None = None,
                    on_problem: Callable[[str], None] | None = None,
                    done: dict[str, tuple[float, str | None, dict[str, Decoded | Failure | None]]] | None = None,
                    batch_size: int = 1, owns: Callable[[int], bool] | None = None) -> EvalRun:
    """Decodes each item with every backend in turn (with `batch_size` > 1, each group of that many items).

    Args:
        items: `asr.batch.sources.Item`s (id, audio, text, subset, language, error).
        backends: one per configuration; the first is the reference for speed-ups and exactness.
        language: decode and score every item in this language (None: each item's own, else detected).
        limit: stop after this many items (None: all).
        warmup: decode the first readable item once with every backend before counting.
        on_item: called after each item with its results (for progress lines).
        on_problem: called with a one-line message for each item or decode that failed.
        done: items of an earlier run of the same configurations (`eval.progress.ItemLog`), by id: their audio
            seconds, why they could not be decoded (or None) and results, taken as they are (no audio read,
            nothing decoded).
        batch_size: items decoded together by backends that can (`decode_many`: this library's, as
            `asr batch --batch-size` decodes them); each backend times the whole group, and an item's seconds
            are its share of the group's by audio length (`EvalRun.batch_size` tells the report).
        owns: which items (by position) this process decodes among several (`asr.batch.shards.Processes`);
            the others are left out of this run.

    Returns:
        The items and, per configuration name, one result per item.
    """
    from asr.batch.sources import load_item_audio

    run = EvalRun(configs=[b.config for b in backends], batch_size=batch_size)
    run.results = {b.config.name: [] for b in backends}
    seen: dict[str, int] = {}
    group: list[tuple[int, EvalItem, Any]] = []  # (position, item, samples) waiting for a batch
    for index, source_item in enumerate(items):
        if limit is not None and index >= limit:
            break
        item = EvalItem(id=_unique(str(source_item.id), seen), display=str(source_item.display),
                        reference=source_item.text, subset=source_item.subset,
                        language=language or source_item.language, error=source_item.error)
        if owns is not None and not owns(index):
            continue
        if done and item.id in done:
            item.audio_seconds, item.error, outcomes = done[item.id]
            run.items.append(item)
            for name, results in run.results.items():
                results.append(outcomes.get(name))
            continue
        samples = None
        if item.error is None:
            try:
                samples = load_item_audio(source_item)
            except ValueError as error:  # audio.AudioError: missing, corrupt, empty or undecodable
                item.error = str(error)
        if samples is not None:
            item.audio_seconds = len(samples) / SAMPLE_RATE
        if item.error is not None and on_problem is not None:
            # Source errors name their file (and line) already.
            on_problem(item.error if item.id in item.error else f"{item.id}: {item.error}")
        run.items.append(item)
        if samples is None:
            for results in run.results.values():
                results.append(None)
            continue
        if warmup and run.warmup_item is None:
            run.warmup_item = item.id
            for backend in backends:
                _decode(backend, samples, item, None)
        for results in run.results.values():
            results.append(None)
        group.append((len(run.items) - 1, item, samples))
        if len(group) == batch_size:
            _decode_group(run, backends, group, on_item, on_problem)
    if group:
        _decode_group(run, backends, group, on_item, on_problem)
    return run


def _decode_group(run: EvalRun, backends: Sequence[Backend], group: list, on_item, on_problem) -> None:
    """Every backend on a group of items (one item when not batching), in rotating order; results into `run`."""
    position = group[0][0]
    start = position % len(backends) if backends else 0
    outcomes: dict[str, list] = {}
    for backend in list(backends[start:]) + list(backends[:start]):
        if len(group) > 1 and hasattr(backend, "decode_many"):
            outcomes[backend.config.name] = _decode_many(backend, group, on_problem)
        else:
            outcomes[backend.config.name] = [_decode(backend, samples, item, on_problem) for _, item, samples in group]
    for k, (index, item, _) in enumerate(group):
        for name in run.results:
            run.results[name][index] = outcomes[name][k]
        if on_item is not None:
            on_item(item, {name: outcomes[name][k] for name in run.results})
    group.clear()


def _decode_many(backend: Backend, group: list, on_problem) -> list[Decoded | Failure]:
    """A group decoded together, timed as a whole; each item's seconds are its share by audio length. A group
    that fails is decoded item by item, so only a failing item fails."""
    start = time.perf_counter()
    try:
        decoded = backend.decode_many([samples for _, _, samples in group],  # type: ignore[attr-defined]
                                      [item.language for _, item, _ in group])
    except Exception:
        logger.debug("%s failed on a group; decoding its items one by one", backend.config.name, exc_info=True)
        return [_decode(backend, samples, item, on_problem) for _, item, samples in group]
    elapsed = time.perf_counter() - start
    audio = sum(item.audio_seconds for _, item, _ in group) or 1.0
    for outcome, (_, item, _) in zip(decoded, group):
        outcome.seconds = elapsed * item.audio_seconds / audio
    return decoded


def _decode(backend: Backend, samples, item: EvalItem, on_problem: Callable[[str], None] | None) -> Decoded | Failure:
    if hasattr(backend, "decode_item"):  # stored transcripts (eval.hypotheses): looked up, not decoded
        try:
            return backend.decode_item(item.id, item.language)
        except (LookupError, RuntimeError) as error:  # counted and reported once per source, not per item
            return Failure(first_line(str(error)))
    start = time.perf_counter()
    try:
        decoded = backend.decode(samples, item.language)
    except Exception as error:  # one item or configuration must not end a long run; the reason is kept
        message = first_line(error)
        failure = Failure(f"{type(error).__name__}: {message}" if message else type(error).__name__)
        logger.debug("%s failed on %s", backend.config.name, item.id, exc_info=True)
        if on_problem is not None:
            on_problem(f"{item.id}: {backend.config.name} failed ({failure.message})")
        return failure
    decoded.seconds = time.perf_counter() - start
    return decoded


def _unique(item_id: str, seen: dict[str, int]) -> str:
    """The id, with `#2`, `#3`... added when several sources give the same one."""
    seen[item_id] = seen.get(item_id, 0) + 1
    return item_id if seen[item_id] == 1 else f"{item_id}#{seen[item_id]}"
