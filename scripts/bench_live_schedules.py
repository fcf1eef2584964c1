"""Live transcription's committed words over several update schedules: the WER of drafted streams of the sonnets
and VoxPopuli updated every `--step` seconds and at random intervals, to judge a change of the stream's policy
(what is committed, where the buffer is cut) by more than one schedule's luck.

    python scripts/bench_live_schedules.py                      # -> docs/figures/live-schedules.{json,md}
    python scripts/bench_live_schedules.py --dtype int8 --out docs/figures/live-schedules-int8

Without `--realtime`: schedule 0 updates every `--step` seconds of audio; schedules 1..N every 1.0-1.8 s of audio
at random (seeds 1..N), as a real-time run's intervals vary with the machine's load. The same schedules give the
same words on any machine, so two policies compare word for word. 2 threads, `base`, drafting by the last
hypothesis (what `asr stream` does on a CPU); latency is the stream's own clock (audio received), not wall time.
"""

from __future__ import annotations

import argparse
import random
import statistics
from typing import Iterator

import numpy as np
from benchlib import SAMPLE_RATE, command_line, figure_path, longform_audio, use_threads, wer_percent, write_figures

FILES = ("sonnets", "voxpopuli-en-000.ogg")


def _chunks(samples: np.ndarray, step: float, seed: int) -> Iterator[np.ndarray]:
    """Schedule 0: every `step` seconds; another: every 1.0-1.8 s at random from `seed`."""
    rng, at = random.Random(seed), 0
    while at < len(samples):
        size = int((step if seed == 0 else rng.uniform(1.0, 1.8)) * SAMPLE_RATE)
        yield samples[at:at + size]
        at += size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", nargs="+", default=list(FILES), help="files of longform/ (\"sonnets\": all three)")
    parser.add_argument("--step", type=float, default=1.0, help="schedule 0's update interval, seconds of audio")
    parser.add_argument("--schedules", type=int, default=4, help="schedule 0 and this many less one at random")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--dtype", default="float32", choices=["float32", "int8"])
    parser.add_argument("--out", default=str(figure_path("live-schedules")))
    args = parser.parse_args()
    use_threads(args.threads)

    import torch

    from asr.live import StreamingTranscriber
    from asr.models.registry import load_model
    from asr.options import TranscribeOptions
    from asr.transcription import transcribe

    bundle = load_model("base", dtype=torch.float32 if args.dtype == "float32" else "int8")
    results = []
    for name in args.files:
        samples, reference = longform_audio(name)
        offline = transcribe(bundle, samples, TranscribeOptions(language="en")).text
        found = {"file": name, "offline_wer": round(wer_percent(reference, offline), 2),
                 "schedules": []}
        for seed in range(args.schedules):
            live = StreamingTranscriber(bundle, TranscribeOptions(language="en"), None, drafting=True)
            for chunk in _chunks(samples, args.step, seed):
                live.insert_audio(chunk)
                live.process()
            live.finish()
            text = "".join(segment.text for segment in live.committed)
            stats = live.stats.to_dict()
            found["schedules"].append({"seed": seed, "updates": stats["updates"],
                                       "wer": round(wer_percent(reference, text), 2),
                                       "latency_mean": stats["latency_mean"], "latency_p90": stats["latency_p90"]})
            print(name, found["schedules"][-1], flush=True)
        found["mean_wer"] = round(statistics.mean(s["wer"] for s in found["schedules"]), 2)
        results.append(found)
    write_figures(args.out, {"files": results, "step": args.step, "threads": args.threads, "dtype": args.dtype},
                  _table(results), command_line())


def _table(results: list[dict]) -> str:
    count = max(len(found["schedules"]) for found in results)
    lines = ["| file | offline WER % | " + " | ".join(f"schedule {i}" for i in range(count)) + " | mean WER % |",
             "| --- | ---: | " + " | ".join("---:" for _ in range(count)) + " | ---: |"]
    for found in results:
        cells = [f"{s['wer']} ({s['latency_mean']} s)" for s in found["schedules"]]
        lines.append(f"| {found['file']} | {found['offline_wer']} | " + " | ".join(cells) + f" | {found['mean_wer']} |")
    lines.append("")
    lines.append("Each cell: the committed text's WER % (the stream clock's mean latency, seconds of audio).")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
