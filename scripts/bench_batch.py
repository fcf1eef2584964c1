"""Throughput of `asr batch` (audio-seconds per second) on the English clips of ../shared/evaldata.

Batch sizes x assistants in this process (the model loaded once, a warm-up first), then the same items under
`accelerate launch` with 2 processes. Prints a markdown table; the median of --repeats runs per row. Writes
docs/figures/batch.json and docs/figures/batch.md (`--out` to change).

    python scripts/bench_batch.py                 # the full table (tens of minutes on 2 cores)
    python scripts/bench_batch.py --short         # 4 clips, two rows per part: checks that it runs
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchlib import (
    REPO,
    command_line,
    figure_path,
    free_port,
    use_threads,
    wer_items,
    write_figures,
)


def english_clips(limit: int | None) -> list[dict]:
    """English WER clips up to 30 s (as tests/test_transcribe.py picks them), with absolute paths."""
    rows = [{key: item[key] for key in ("id", "audio", "text")}
            for item in wer_items(("librispeech", "ljspeech", "clips", "fleurs"), max_seconds=30.0)]
    return rows[:limit] if limit else rows


def in_process(manifest: Path, work: Path, bundle, assistants: dict, batch_sizes: list[int], repeats: int) -> list[dict]:
    from asr.batch.run import BatchOptions, run_batch

    results = []
    for name, assistant in assistants.items():
        for batch_size in batch_sizes:
            walls, audio = [], 0.0
            for repeat in range(repeats):
                output = work / f"{name.replace(':', '-')}-{batch_size}-{repeat}.jsonl"
                summary = run_batch(str(manifest), output, bundle, assistant,
                                    batch=BatchOptions(batch_size=batch_size, progress=False))
                walls.append(summary.wall_seconds)
                audio = summary.audio_seconds
            results.append({"assistant": name, "batch": batch_size, "processes": 1, "audio": audio,
                            "wall": statistics.median(walls)})
            print(f"  {name} batch {batch_size}: {audio / results[-1]['wall']:.2f} audio-s/s", file=sys.stderr)
    return results


def two_processes(manifest: Path, work: Path, model: str, assistant: str, batch_size: int, repeats: int) -> dict:
    """One row from `accelerate launch --multi_gpu --num_processes 2` (torchrun; CPU processes without GPUs)."""
    walls, audio = [], 0.0
    for repeat in range(repeats):
        output = work / f"procs2-{assistant.replace(':', '-')}-{batch_size}-{repeat}.jsonl"
        port = free_port()
        command = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
                   "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
                   "--main_process_port", str(port), "-m", "asr", "batch", str(manifest), "-o", str(output),
                   "-q", "--model", model, "--assistant", assistant, "--batch-size", str(batch_size)]
        result = subprocess.run(command, check=False, cwd=REPO, capture_output=True, text=True)
        if result.returncode != 0:
            raise SystemExit(f"2-process run failed:\n{result.stderr[-3000:]}")
        # The summary line of process 0: "... (N s) of audio in W s, RTF ..." (model loading excluded).
        found = re.search(r"\(([\d.]+) s\) of audio in ([\d.]+) s", result.stderr)
        audio, wall = float(found.group(1)), float(found.group(2))
        walls.append(wall)
    return {"assistant": assistant, "batch": batch_size, "processes": 2, "audio": audio, "wall": statistics.median(walls)}


def table(rows: list[dict]) -> str:
    base = {(r["assistant"], r["processes"]): r for r in rows if r["batch"] == 1}
    plain = {(r["batch"], r["processes"]): r for r in rows if r["assistant"] == "none"}
    lines = ["| assistant | batch size | processes | audio s | wall s | audio-s/s | RTF | vs batch 1 | vs no assistant |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        speed = r["audio"] / r["wall"]
        one = base.get((r["assistant"], r["processes"]))
        none = plain.get((r["batch"], r["processes"]))
        vs_one = f"{speed / (one['audio'] / one['wall']):.2f}x" if one else "-"
        vs_none = f"{speed / (none['audio'] / none['wall']):.2f}x" if none else "-"
        lines.append(f"| {r['assistant']} | {r['batch']} | {r['processes']} | {r['audio']:.1f} | {r['wall']:.1f} | "
                     f"{speed:.2f} | {r['wall'] / r['audio']:.3f} | {vs_one} | {vs_none} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--short", action="store_true", help="4 clips, batch sizes 1 and 4, none and self:int8.")
    parser.add_argument("--model", default="base")
    parser.add_argument("--assistants", default="none,self:int8,self:bf16,tiny.en")
    parser.add_argument("--batch-sizes", default="1,4,8")
    parser.add_argument("--process-runs", default="none:1,none:8",
                        help="2-process rows as ASSISTANT:BATCH, comma-separated ('' for none).")
    parser.add_argument("--repeats", type=int, default=1, help="Runs per row (the median is reported).")
    parser.add_argument("--threads", type=int, default=2, help="Torch threads in this process.")
    parser.add_argument("--out", default=str(figure_path("batch")), help="writes OUT.json and OUT.md")
    args = parser.parse_args()
    if args.short:
        args.assistants, args.batch_sizes, args.process_runs = "none,self:int8", "1,4", "none:2"

    from asr.assist.choose import load_pair, make_assistant

    use_threads(args.threads)
    clips = english_clips(4 if args.short else None)
    with tempfile.TemporaryDirectory(prefix="bench-batch-") as folder:
        work = Path(folder)
        manifest = work / "manifest.jsonl"
        manifest.write_text("".join(json.dumps(row) + "\n" for row in clips))
        print(f"{len(clips)} clips; loading {args.model}", file=sys.stderr)
        bundle, _ = load_pair(args.model, "none")
        assistants = {name: make_assistant(name, bundle) for name in args.assistants.split(",")}
        from asr.transcription import transcribe

        warm = time.perf_counter()
        transcribe(bundle, clips[0]["audio"])  # warm-up: first-call allocations and kernel selection
        print(f"warm-up {time.perf_counter() - warm:.1f} s", file=sys.stderr)
        rows = in_process(manifest, work, bundle, assistants, [int(b) for b in args.batch_sizes.split(",")],
                          args.repeats)
        for run in filter(None, args.process_runs.split(",")):
            assistant, _, batch_size = run.rpartition(":")
            rows.append(two_processes(manifest, work, args.model, assistant, int(batch_size), args.repeats))
    caption = (f"{len(clips)} English clips of ../shared/evaldata, model {args.model}, "
               f"{args.threads} threads in one process, {max(1, (os.cpu_count() or 2) // 2)} per process with 2; "
               f"median of {args.repeats} run(s)")
    print(f"\n{caption}\n")
    print(table(rows))
    write_figures(args.out, {"clips": len(clips), "model": args.model, "repeats": args.repeats, "rows": rows},
                  f"{caption}.\n\n{table(rows)}", command_line())


if __name__ == "__main__":
    main()
