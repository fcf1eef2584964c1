"""`base` with its decoder layers offloaded to disk: pass costs, the resident assistant's step, and end to end.

    python scripts/bench_offload.py [--threads 2] [--repeats 2] [--pass-repeats 9]
        [--configs memory:none,disk:none,disk:auto] [--readers read,mmap,accelerate] [--out docs/figures/offload]
        [--memory-limit MB]

1. Per-pass cost, one process, configurations interleaved: the model's decoder in memory and offloaded to
   disk through each reader (`asr.models.layer_store.READERS`) with and without prefetching the next layer, and
   `read` with each layer file dropped from the page cache after it is read (`cold`: every read from the
   disk); passes over 1 to 16 new tokens after 100 cached ones; and one step of the `self:int8` assistant.
2. End to end on the three sonnets joined (158 s), each configuration `PLACE:ASSISTANT[:SCHEDULE:K]` in a
   fresh process (PLACE: memory, disk, disk-mmap (the `mmap` reader) or disk-cold), configurations interleaved over `--repeats` rounds:
   wall time of `transcribe` after a 2 s warm-up, whether the words equal in-memory plain greedy's, and the
   process's peak resident memory (VmHWM) after loading and at the end. ASSISTANT may carry a precision
   (`disk:base-draft:int8:constant:10`).
3. With `--memory-limit MB`, every end-to-end configuration runs in a memory cgroup (v1 or v2; the machine must
   let this user create one) limited to MB, which counts the page cache: offloaded layers read from disk no
   longer stay cached, as on a machine too small for the model. Before each limited run the page cache is
   emptied, so that the run reads (and is charged for) the model's files itself. A configuration that does not
   fit is killed and reported so, one that runs past `--time-limit S` is stopped. Each round starts with an
   in-memory greedy run without the limit, the reference for words and speed (`memory:none (no limit)`).

Writes docs/figures/offload.json and docs/figures/offload.md, both tables (`--out` to change; `--render`
rewrites OUT.md from OUT.json); each end-to-end run is also appended to OUT.runs.jsonl as it ends.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchlib import (
    REPO,
    SAMPLE_RATE,
    command_line,
    figure_path,
    figure_stem,
    rewrite_markdown,
    sonnets,
    write_figures,
)

WIDTHS = (1, 2, 4, 8, 12, 16)
CACHED = 100


def _peak_mb() -> dict[str, float]:
    status = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line)
    return {key: int(status[key].split()[0]) / 1024 for key in ("VmHWM", "VmRSS", "RssAnon")}


class AnonymousPeak:
    """The most anonymous memory (RssAnon: what the kernel cannot drop and read again from a file, with no swap)
    the process held, sampled every 20 ms on a thread: the resident set (VmHWM) also counts mapped file pages,
    which a memory limit only evicts."""

    def __init__(self) -> None:
        import threading

        self.mb = 0.0
        threading.Thread(target=self._sample, daemon=True).start()

    def _sample(self) -> None:
        while True:
            self.mb = max(self.mb, _peak_mb()["RssAnon"])
            time.sleep(0.02)


def _offload(place: str, reader: str = "read", prefetch: bool = True):
    from asr.models.offload import OffloadOptions

    if place == "memory":
        return None
    if place == "disk-mmap":
        reader = "mmap"
    return OffloadOptions("disk", reader=reader, prefetch=prefetch, drop_page_cache=place == "disk-cold")


def pass_costs(readers: list[str], repeats: int) -> dict:
    """Median milliseconds per decoder pass by configuration and width, and of one int8 draft step."""
    import torch

    from asr.assist.choose import make_assistant
    from asr.models.registry import load_model
    from asr.whisper.decoder import WhisperDecoderAdapter

    models = {"memory": load_model("base").model}
    for reader in readers:
        for prefetch in (True, False):
            name = f"disk {reader}" + (" + prefetch" if prefetch else "")
            models[name] = load_model("base", offload=_offload("disk", reader, prefetch)).model
    models["disk-cold read + prefetch"] = load_model("base", offload=_offload("disk-cold")).model
    int8 = make_assistant("self:int8", load_model("base", offload=_offload("disk")))
    encoder_output = torch.randn(1, 1500, 512)
    ids = torch.randint(0, 50000, (1, CACHED + max(WIDTHS)))
    adapters = {name: WhisperDecoderAdapter(model, encoder_output) for name, model in models.items()}
    adapters["self:int8 step"] = WhisperDecoderAdapter(int8.decoder_model, encoder_output.to(int8.dtype))
    caches = {name: adapter.new_cache(1) for name, adapter in adapters.items()}
    for name, adapter in adapters.items():
        adapter.forward(ids[:, :CACHED], caches[name], 1)
    times: dict[str, dict[int, list[float]]] = {name: {w: [] for w in WIDTHS} for name in adapters}
    for _ in range(repeats + 1):  # the first round warms up
        for width in WIDTHS:
            for name, adapter in adapters.items():
                if name == "self:int8 step" and width > 1:
                    continue
                adapter.crop(caches[name], CACHED)
                start = time.perf_counter()
                adapter.forward(ids[:, CACHED:CACHED + width], caches[name], width)
                times[name][width].append((time.perf_counter() - start) * 1000)
    return {name: {w: statistics.median(t[1:]) for w, t in by_width.items() if t} for name, by_width in times.items()}


def child(config: str, threads: int) -> None:
    """One end-to-end run in this process; prints one JSON line."""
    import torch

    from asr.assist.choose import make_assistant
    from asr.transcription import transcribe
    from asr.models.registry import load_model
    from asr.options import TranscribeOptions

    torch.set_num_threads(threads)
    from decoding.kernels.products import limit_kernel_caches

    limit_kernel_caches()  # as the command line does
    place, *parts = config.split(":")
    drafting = parts[-2:] if len(parts) >= 3 and parts[-1].isdigit() else []
    spec = ":".join(parts[: len(parts) - len(drafting)])
    options = TranscribeOptions(schedule=drafting[0], num_assistant_tokens=int(drafting[1])) if drafting \
        else TranscribeOptions()
    audio = sonnets()
    anonymous = AnonymousPeak()
    start = time.perf_counter()
    bundle = load_model("base", offload=_offload(place))
    assistant = make_assistant(spec, bundle)
    loaded = time.perf_counter() - start
    after_load = _peak_mb()
    transcribe(bundle, audio[: 2 * SAMPLE_RATE], options, assistant)  # warm-up
    start = time.perf_counter()
    result = transcribe(bundle, audio, options, assistant)
    seconds = time.perf_counter() - start
    g = result.stats.generation
    print(json.dumps({
        "config": config, "seconds": seconds, "load_seconds": loaded, "text": result.text,
        "assistant": getattr(assistant, "name", "none"), "drafting": options.drafting(getattr(assistant, "schedule", None)),
        "peak_mb_after_load": after_load["VmHWM"], "peak_mb": _peak_mb()["VmHWM"],
        "peak_anonymous_mb": anonymous.mb,
        "encode_seconds": result.stats.encode_seconds, "model_seconds": g.model_seconds,
        "assistant_seconds": g.assistant_seconds, "generated_tokens": g.generated_tokens,
        "model_passes": g.model_forward_passes, "acceptance": g.acceptance_rate if g.drafted_tokens else None,
    }))


UNLIMITED = "memory:none (no limit)"


def memory_group(limit_mb: int) -> Path:
    """A new memory cgroup limited to `limit_mb` (page cache included); SystemExit where none can be made."""
    root = Path("/sys/fs/cgroup")
    v1 = (root / "memory" / "cgroup.procs").exists()
    group = (root / "memory" if v1 else root) / f"asr-bench-offload-{os.getpid()}"
    try:
        group.mkdir()
        (group / ("memory.limit_in_bytes" if v1 else "memory.max")).write_text(str(limit_mb * 2**20))
    except OSError as error:
        raise SystemExit(f"--memory-limit: cannot make a memory cgroup here ({error})") from None
    return group


def evict_page_cache() -> None:
    """Empties the page cache before a limited run, so that the model's files are read (and charged) inside the
    cgroup: a page stays charged to the group that first read it, so files the parent or an earlier run read
    would otherwise be free to the limited process. All of the machine's clean cache where this user may
    (`/proc/sys/vm/drop_caches`), else the model cache's files (pages no process maps)."""
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("1")
    except OSError:
        from asr.models.cache import cache_dir

        for path in [*cache_dir().rglob("*"), *(REPO / "asr" / "assist" / "drafts").rglob("*")]:
            if path.is_file():
                with path.open("rb") as handle:
                    os.posix_fadvise(handle.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)


def end_to_end(configs: list[str], repeats: int, threads: int, log: Path, group: Path | None = None,
               time_limit: float | None = None) -> list[dict]:
    """Every configuration in a fresh process (in `group` when given), interleaved; each run is also appended to
    `log` as it ends. A run past `time_limit` seconds (one thrashing under a limit) is stopped and reported so."""
    runs = []
    log.write_text("")
    for repeat in range(repeats):
        for label in ([UNLIMITED] if group else []) + configs:
            limited = group if label != UNLIMITED else None
            config = label.split(" ")[0]
            enter = (lambda procs=limited / "cgroup.procs": procs.write_text(str(os.getpid()))) if limited else None
            if limited:
                evict_page_cache()
            try:
                out = subprocess.run([sys.executable, __file__, "--child", config, "--threads", str(threads)],
                                     check=False, capture_output=True, text=True, cwd=REPO, preexec_fn=enter,
                                     timeout=time_limit)
            except subprocess.TimeoutExpired:
                out = None
            if out is not None and out.returncode == 0:
                run = json.loads(out.stdout.strip().splitlines()[-1])
                outcome = f"{run['seconds']:7.2f} s  peak {run['peak_mb']:.0f} MB"
            else:
                if out is None:
                    reason = f"stopped after {time_limit:.0f} s (paging its weights in and out)"
                elif out.returncode == -9 and limited is not None:
                    reason = "killed: does not fit the memory limit"
                else:
                    reason = (out.stderr.strip().splitlines() or ["?"])[-1]
                run, outcome = {"failed": reason}, f"failed: {reason}"
            run["config"], run["repeat"] = label, repeat
            with log.open("a") as handle:
                handle.write(json.dumps(run) + "\n")
            print(f"{repeat} {label:28s} {outcome}", flush=True)
            runs.append(run)
    return runs


def summarize(runs: list[dict], configs: list[str]) -> list[dict]:
    reference = next(r["text"] for r in runs if r["config"] == configs[0] and "failed" not in r)
    rows = []
    for config in configs:
        mine = [r for r in runs if r["config"] == config and "failed" not in r]
        if not mine:
            rows.append({"config": config, "failed": next(r["failed"] for r in runs if r["config"] == config)})
            continue
        rows.append({
            "config": config, "median_seconds": statistics.median(r["seconds"] for r in mine),
            "seconds": [r["seconds"] for r in mine], "same_words": all(r["text"] == reference for r in mine),
            "peak_mb": statistics.median(r["peak_mb"] for r in mine),
            "peak_mb_after_load": statistics.median(r["peak_mb_after_load"] for r in mine),
            "peak_anonymous_mb": statistics.median(r.get("peak_anonymous_mb", float("nan")) for r in mine),
            **{k: mine[-1][k] for k in ("assistant", "drafting", "model_passes", "generated_tokens", "acceptance",
                                        "encode_seconds", "model_seconds", "assistant_seconds", "load_seconds")},
        })
    return rows


def markdown(result: dict) -> str:
    passes, rows = result["pass_ms"], result["end_to_end"]
    lines = [f"Milliseconds per decoder pass of `base` over k new tokens after {CACHED} cached ones (medians):", "",
             "| decoder | " + " | ".join(f"k={w}" for w in WIDTHS) + " |",
             "| --- | " + " | ".join("---:" for _ in WIDTHS) + " |"]
    for name, by_width in passes.items():
        cells = [f"{by_width[str(w)]:.1f}" if str(w) in by_width else "" for w in WIDTHS]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    memory = next(r for r in rows if r["config"].startswith("memory:none") and "failed" not in r)
    plain = {r["config"].split(":")[0]: r for r in rows if r["config"].split(":")[1] == "none" and "failed" not in r}
    limit = result.get("memory_limit_mb")
    where = f" in a memory cgroup of {limit} MB (page cache included)" if limit else ""
    lines += ["", (f"The sonnets (158 s), each configuration in its own process{where}, medians of "
                   f"{len(rows[0]['seconds'])} interleaved runs:"), "",
              ("| configuration | assistant, drafting | median s | runs s | time / in-memory greedy's "
               "| speed-up over greedy, same placement | same words | model passes / tokens | acceptance "
               "| peak RSS MB (after audio and load) | peak anonymous MB |"),
              "| --- | --- | ---: | --- | ---: | ---: | --- | --- | ---: | ---: | ---: |"]
    for r in rows:
        if "failed" in r:
            lines.append(f"| `{r['config']}` | | | | | | | | | {r['failed']} | |")
            continue
        versus = f"{r['median_seconds'] / memory['median_seconds']:.2f}"
        same_place = plain.get(r["config"].split(":")[0])
        against = "" if same_place is None or r["config"] == UNLIMITED else \
            f"{same_place['median_seconds'] / r['median_seconds']:.2f}x"
        acceptance = "-" if r["acceptance"] is None else f"{100 * r['acceptance']:.0f} %"
        drafting = "-" if r["assistant"] == "none" else f"{r['assistant']}, {r['drafting'][0]} k={r['drafting'][1]}"
        lines.append(f"| `{r['config']}` | {drafting} | {r['median_seconds']:.2f} | "
                     f"{' / '.join(f'{s:.1f}' for s in r['seconds'])} | {versus} | {against} | "
                     f"{'yes' if r['same_words'] else 'NO'} | {r['model_passes']} / {r['generated_tokens']} | "
                     f"{acceptance} | {r['peak_mb']:.0f} ({r['peak_mb_after_load']:.0f}) | "
                     f"{r.get('peak_anonymous_mb', float('nan')):.0f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--pass-repeats", type=int, default=9)
    parser.add_argument("--configs", default="memory:none,disk:none,disk:auto")
    parser.add_argument("--readers", default="read,mmap,accelerate")
    parser.add_argument("--out", default=str(figure_path("offload")), help="writes OUT.json and OUT.md")
    parser.add_argument("--render", action="store_true", help="only rewrite OUT.md from OUT.json")
    parser.add_argument("--memory-limit", type=int, default=None, metavar="MB",
                        help="run the end-to-end configurations in a memory cgroup of this many MB")
    parser.add_argument("--time-limit", type=float, default=None, metavar="S",
                        help="stop an end-to-end run after S seconds (with --memory-limit: one that thrashes)")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.threads)
        return
    if args.render:
        rewrite_markdown(args.out, markdown)
        return
    import torch

    torch.set_num_threads(args.threads)
    from decoding.kernels.products import limit_kernel_caches

    limit_kernel_caches()  # as the command line does
    configs = args.configs.split(",")
    if not configs[0].startswith("memory:none"):
        raise SystemExit("--configs must start with memory:none (the reference for words and speed)")
    passes = pass_costs(args.readers.split(","), args.pass_repeats)
    for name, by_width in passes.items():
        print(f"{name:28s} " + "  ".join(f"{w}:{ms:.1f}" for w, ms in by_width.items()), flush=True)
    out = figure_stem(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    group = memory_group(args.memory_limit) if args.memory_limit else None
    try:
        runs = end_to_end(configs, args.repeats, args.threads, Path(f"{out}.runs.jsonl"), group, args.time_limit)
    finally:
        if group is not None:
            group.rmdir()
    if group is not None:
        configs = [UNLIMITED] + configs
    result = {"memory_limit_mb": args.memory_limit,
        "pass_ms": {name: {str(w): ms for w, ms in by_width.items()} for name, by_width in passes.items()},
        "end_to_end": summarize(runs, configs), "runs": [{k: v for k, v in r.items() if k != "text"} for r in runs],
    }
    table = markdown(result)
    print(table)
    write_figures(out, result, table, command_line())


if __name__ == "__main__":
    main()
