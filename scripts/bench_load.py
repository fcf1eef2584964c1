"""Time the first load (CTranslate2 -> transformers conversion into an empty cache) and cached loads of a model.

Usage: python scripts/bench_load.py [--model base] [--repeats 5] [--cache DIR] [--out docs/figures/load]

Without --cache, a temporary cache folder is used and removed afterwards, so the first load always converts.
Prints the times and writes them to docs/figures/load.json and docs/figures/load.md (`--out` to change).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time

from benchlib import command_line, figure_path, write_figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="base", help="model name for asr.models.registry.load_model")
    parser.add_argument("--repeats", type=int, default=5, help="cached loads to time (median reported)")
    parser.add_argument("--cache", help="cache folder to use (default: a fresh temporary one)")
    parser.add_argument("--out", default=str(figure_path("load")), help="writes OUT.json and OUT.md")
    args = parser.parse_args()

    cache = args.cache or tempfile.mkdtemp(prefix="assisted-whisper-bench-")
    os.environ["ASSISTED_WHISPER_CACHE"] = cache
    start = time.perf_counter()
    import torch  # noqa: F401  (imports are timed apart from loading)

    from asr.models.registry import load_model

    imports = time.perf_counter() - start
    try:
        start = time.perf_counter()
        bundle = load_model(args.model)
        first = time.perf_counter() - start
        source = bundle.source
        del bundle
        cached = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            load_model(args.model)
            cached.append(time.perf_counter() - start)
    finally:
        if not args.cache:
            shutil.rmtree(cache, ignore_errors=True)

    into = "the given" if args.cache else "an empty"
    cached_line = (f"median {statistics.median(cached):.2f} s, min {min(cached):.2f} s, "
                   f"max {max(cached):.2f} s over {len(cached)} loads")
    print(f"model            {args.model} ({source})")
    print(f"imports          {imports:.2f} s")
    print(f"first load       {first:.2f} s (conversion into {into} cache)")
    print(f"cached load      {cached_line}")
    table = "\n".join([f"Model `{args.model}` ({source}).", "", "| step | time |", "| --- | --- |",
                       f"| imports | {imports:.2f} s |",
                       f"| first load | {first:.2f} s (conversion into {into} cache) |",
                       f"| cached load | {cached_line} |"])
    data = {"model": args.model, "source": str(source), "imports_s": imports, "first_load_s": first,
            "given_cache": bool(args.cache), "cached_loads_s": cached}
    write_figures(args.out, data, table, command_line())


if __name__ == "__main__":
    main()
