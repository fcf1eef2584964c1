"""One call from sources and configuration strings to a finished report dictionary (what `asr eval` runs)."""

from __future__ import annotations

import datetime
import itertools
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from eval.configs import parse_configs
from eval.metrics import summarize
from eval.runner import run_interleaved


def evaluate(
    sources: Sequence[str],
    compare: Sequence[str],
    *,
    model: str = "base",
    language: str | None = None,
    limit: int | None = None,
    device: str = "cpu",
    dtype: Any = None,
    audio_column: str = "audio",
    text_column: str = "text",
    on_message: Callable[[str], None] | None = None,
    on_item: Callable | None = None,
    offload: Any = None,
    hypotheses: Sequence[str] = (),
    folder: str | None = None,
    resume: bool = False,
    batch_size: int = 1,
) -> dict[str, Any] | None:
    """Runs every configuration over the items of `sources`, interleaved, and summarises the run.

    Args:
        sources: folders, manifests or datasets, as `asr batch` takes them.
        compare: configuration strings (see `eval.configs`); the first is the reference.
        model: the Whisper model every configuration decodes with.
        language: decode and score every item in this language (None: each item's own, else detected).
        limit: evaluate only the first `limit` items (over all sources).
        device, dtype: where and in which precision the model runs (dtype None: float32).
        on_message: called with one-line messages: skipped configurations, bad items, failed decodes.
        on_item: called after each item with (item, {configuration: result}).
        offload: `asr.models.offload.OffloadOptions` for the model (None: all of it on `device`).
        hypotheses: stored transcripts to score beside the configurations, `FILE[:NAME]` each
            (`eval.hypotheses`); with no `compare`, nothing is decoded and no model is loaded.
        folder: the report folder: each item's rows go to its items.jsonl as the item is done
            (`eval.progress.ItemLog`); None: nowhere until the report is written.
        resume: continue the run whose items.jsonl is in `folder`: its items are not decoded again.
        batch_size: items this library's configurations decode together (`asr batch --batch-size`); each
            configuration is then timed per group, and per-item times are left out of the report.

    Under `accelerate launch --num_processes N` (torchrun's variables), process k decodes items k, k + N, ...
    into `folder`/items.jsonl.part-k-of-N; process 0 then reads every part and reports on all items (each
    once); the other processes return None.

    Returns:
        `eval.metrics.summarize`'s dictionary with a `run` entry (model, device, sources, versions...).

    Raises:
        ValueError: a bad configuration or source, an unknown model or assistant, or nothing that can run.
    """
    import torch
    import transformers

    from asr.batch.shards import detect_processes, finish, mark_done, marker_path, part_path, wait_for_parts
    from asr.models.offload import resolve_offload
    from asr.models.registry import load_model
    from eval.backends import make_backends
    from eval.hypotheses import StoredBackend, read_hypotheses
    from eval.progress import read_done

    message = on_message or (lambda _: None)
    configs = parse_configs(compare) if compare else []
    stored = [read_hypotheses(spec) for spec in hypotheses]  # a bad file fails before any model loads
    names = [c.name for c in configs] + [s.name for s in stored]
    if len(set(names)) != len(names):
        raise ValueError(f"configuration names must differ (give a hypotheses file another as FILE:NAME): {names}")
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be >= 1, got {limit}")
    if batch_size < 1:
        raise ValueError(f"batch size must be >= 1, got {batch_size}")
    items = _open_sources(sources, audio_column, text_column)
    processes = detect_processes()
    if processes.count > 1 and folder is None:
        raise ValueError("several processes need a report folder to share their items through")
    dtype = dtype or torch.float32
    offload = resolve_offload(offload, device)
    backends: list = []
    skipped: dict[str, str] = {}
    if configs:
        bundle = load_model(model, device=device, dtype=dtype, offload=offload)
        backends, skipped = make_backends(configs, model, bundle, device=device, dtype=dtype,
                                          threads=torch.get_num_threads(), offload=offload)
    for name, reason in skipped.items():
        message(f"skipping configuration {name}: {reason}")
    if not backends and not stored:
        raise ValueError("no configuration can run here: " + "; ".join(f"{n}: {r}" for n, r in skipped.items()))
    backends += [StoredBackend(s) for s in stored]
    run = _run(items, backends, folder, resume, processes, message, on_item, language=language, limit=limit,
               warmup=bool(configs), batch_size=batch_size)
    if processes.count > 1:  # this process's share is done; process 0 reports on every share
        share = part_path(Path(folder) / "items.jsonl", processes.index, processes.count)
        mark_done(share, {})
        if not processes.is_main:
            finish(processes)
            return None
        wait_for_parts(share.with_name("items.jsonl"), processes.count)
        done = {}
        parts = [part_path(share.with_name("items.jsonl"), k, processes.count) for k in range(processes.count)]
        for part in parts:
            done.update(read_done(part, [b.config.name for b in backends]))
        for part in parts:  # the report's items.jsonl takes their place
            part.unlink(missing_ok=True)
            marker_path(part).unlink(missing_ok=True)
        finish(processes)
        run = run_interleaved(_open_sources(sources, audio_column, text_column), backends, language=language,
                              limit=limit, warmup=False, done=done, batch_size=batch_size)
        run.batch_size = batch_size
        message(f"merged the shares of {processes.count} processes: {len(done)} item(s)")
    run.skipped = skipped
    missing = [item.id for item in run.items if item.error is None and item.reference is None]
    if missing:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        message(f"{len(missing)} item(s) without reference text, timed but not scored: {shown}")
    report = summarize(run)
    report["hypotheses"] = []
    for source in stored:
        failed = {f["id"] for c in report["configurations"] if c["name"] == source.name for f in c["items_failed"]}
        missing = [item.id for item in run.items if item.id in failed and source.find(item.id) is None]
        for line in source.problems(missing):
            message(line)
        report["hypotheses"].append(source.summary(missing))
    report["run"] = {
        "model": model, "device": device, "dtype": str(dtype).replace("torch.", ""),
        "offload": None if offload is None else {"device": offload.device, "max_memory": offload.max_memory},
        "threads": torch.get_num_threads(), "sources": list(sources),
        "configurations": names, "language": language, "limit": limit, "batch_size": batch_size,
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
    }
    return report


def _run(items: Iterator, backends: list, folder: str | None, resume: bool, processes: Any, message: Callable,
         on_item: Callable | None, **options: Any) -> Any:
    """This process's share of the items, each item's rows written to items.jsonl (or this process's part of it)
    as the item is done (`eval.progress.ItemLog`); with `resume`, the items there are taken as they are."""
    from asr.batch.shards import marker_path, part_path, start_together
    from eval.progress import ItemLog

    log = None
    if folder is not None:
        path = Path(folder) / "items.jsonl"
        if processes.count > 1:
            path = part_path(path, processes.index, processes.count)
            marker_path(path).unlink(missing_ok=True)  # an earlier run's marker must not pass for this one's
            start_together(processes, cpu=True)  # every stale marker is gone before any process can finish
        log = ItemLog(path, [b.config.name for b in backends], resume)

    def finished(item, outcomes) -> None:
        if log is not None:
            log.write(item, outcomes)
        if on_item is not None:
            on_item(item, outcomes)

    try:
        run = run_interleaved(items, backends, on_item=finished, on_problem=message,
                              done=log.done if log is not None else None,
                              owns=processes.owns if processes.count > 1 else None, **options)
    finally:
        if log is not None:
            log.close()
    if log is not None and log.done:
        message(f"resumed: {sum(item.id in log.done for item in run.items)} item(s) from {log.path}, "
                f"{sum(item.id not in log.done for item in run.items)} decoded now")
    return run


def _open_sources(sources: Sequence[str], audio_column: str, text_column: str) -> Iterator:
    """The items of every source in turn; a source that cannot be opened fails here, before any model loads."""
    from asr.batch.sources import iter_items

    if not sources:
        raise ValueError("no source given")
    opened = []
    for source in sources:
        iterator = iter_items(source, audio_column=audio_column, text_column=text_column)
        first = next(iterator, None)  # iter_items raises ValueError on its first step for a bad source
        opened.append(itertools.chain([first], iterator) if first is not None else iter(()))
    return itertools.chain.from_iterable(opened)
