"""`asr eval --batch-size`: the same configuration item at a time and batched, on a manifest of the English
evaluation recordings repeated under distinct ids; wall time, RTFx and WER of each.

    python scripts/bench_eval_batched.py                       # 2 copies (130 items) -> docs/figures/eval-batched
    python scripts/bench_eval_batched.py --copies 16 --out /tmp/eval-1000   # ~1,000 items

Each run is a whole `asr eval` command in its own process (2 threads, `base`, `--compare greedy`), batch size 1
first, then `--batch-size` (8); the runs' reports go to a temporary folder.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchlib import REPO, command_line, figure_path, machine, wer_items, write_figures

FOLDERS = ("librispeech", "ljspeech", "clips", "spontaneous", "fleurs")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--copies", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--compare", default="greedy")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--dtype", default="float32", help="the model's precision in both runs (`asr eval --dtype`)")
    parser.add_argument("--out", default=str(figure_path("eval-batched")))
    args = parser.parse_args()
    items = wer_items(FOLDERS, skip_missing=True)
    work = Path(tempfile.mkdtemp(prefix="eval-batched-"))
    manifest = work / "manifest.jsonl"
    manifest.write_text("".join(json.dumps({"id": f"{item['id']}#{copy}", "audio": item["audio"],
                                            "text": item["text"], "language": item["language"],
                                            "subset": item["subset"]}) + "\n"
                                for copy in range(args.copies) for item in items))
    found, runs = machine(), {}
    for size in (1, args.batch_size):
        started = time.perf_counter()
        subprocess.run([sys.executable, "-m", "asr", "eval", str(manifest), "--compare", args.compare, "--threads",
                        str(args.threads), "--dtype", args.dtype, "--batch-size", str(size),
                        "--report", str(work / f"b{size}"), "-q"], cwd=REPO, check=True)
        report = json.loads((work / f"b{size}" / "report.json").read_text())
        config = report["configurations"][0]
        runs[size] = {"wall_seconds": round(time.perf_counter() - started, 1),
                      "decoding_seconds": config["total_seconds"], "rtfx": config["rtfx"], "wer": config["wer"],
                      "items": config["items_decoded"], "texts": [r["hypothesis"] for r in config["items"]]}
        print(f"batch {size}: {runs[size]['decoding_seconds']:.1f} s decoding, WER {100 * config['wer']:.2f} %",
              flush=True)
    one, many = runs[1], runs[args.batch_size]
    same = sum(a == b for a, b in zip(one["texts"], many["texts"]))
    data = {"items": len(items) * args.copies, "copies": args.copies, "compare": args.compare, "dtype": args.dtype,
            "audio_seconds": round(sum(i["duration_s"] for i in items) * args.copies, 1),
            "runs": {str(k): {key: v for key, v in run.items() if key != "texts"} for k, run in runs.items()},
            "same_text": same}
    table = "\n".join([
        f"`{args.compare}` (`--dtype {args.dtype}`) on {data['items']} items ({args.copies} copies of the "
        f"{len(items)} English recordings, {data['audio_seconds']:.0f} s of audio), one `asr eval` run each:", "",
        "| | decoding s | RTFx | WER | items |", "| --- | --- | --- | --- | --- |",
        *(f"| `--batch-size {k}` | {r['decoding_seconds']:.1f} | {r['rtfx']:.1f} | {100 * r['wer']:.2f} % | "
          f"{r['items']} |" for k, r in runs.items()), "",
        f"Batched {one['decoding_seconds'] / many['decoding_seconds']:.2f}x item at a time; the same text on "
        f"{same} of {data['items']} items."])
    write_figures(args.out, data, table + "\n", command_line(), found)
    print(table)


if __name__ == "__main__":
    main()
