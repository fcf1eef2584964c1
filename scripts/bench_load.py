"""Time the first load (CTranslate2 -> transformers conversion into an empty cache) and cached loads of a model.

Usage: python scripts/bench_load.py [--model base] [--repeats 5] [--cache DIR]

Without --cache, a temporary cache folder is used and removed afterwards, so the first load always converts.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="base", help="model name for asr.models.registry.load_model")
    parser.add_argument("--repeats", type=int, default=5, help="cached loads to time (median reported)")
    parser.add_argument("--cache", help="cache folder to use (default: a fresh temporary one)")
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

    print(f"model            {args.model} ({source})")
    print(f"imports          {imports:.2f} s")
    print(f"first load       {first:.2f} s (conversion into {'the given' if args.cache else 'an empty'} cache)")
    print(f"cached load      median {statistics.median(cached):.2f} s, min {min(cached):.2f} s, "
          f"max {max(cached):.2f} s over {len(cached)} loads")


if __name__ == "__main__":
    main()
