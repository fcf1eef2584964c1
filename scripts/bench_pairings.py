"""Side-by-side timing of every assistant available here on the sonnets (158 s), ours only, interleaved.

    python scripts/bench_pairings.py [--repeats 2] [--threads 2] [--specs none,self:int8,self:bf16,tiny.en,self]
        [--out docs/figures/pairings]

Prints, per run, wall time, encoder / model / assistant seconds, acceptance and model passes per token, and
at the end the median wall time and speed-up against plain greedy, a table also written to
docs/figures/pairings.json and docs/figures/pairings.md (`--out` to change). `scripts/bench_longform.sh` adds
transformers' and faster-whisper's figures through `asr eval`.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from benchlib import (
    SAMPLE_RATE,
    command_line,
    figure_path,
    sonnets,
    use_threads,
    write_figures,
)

from asr.assist.choose import make_assistant
from asr.transcription import transcribe
from asr.models.registry import load_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--specs", default="none,self:int8,self:bf16,tiny.en,self")
    parser.add_argument("--out", default=str(figure_path("pairings")), help="writes OUT.json and OUT.md")
    args = parser.parse_args()
    use_threads(args.threads)
    bundle = load_model("base")
    audio = sonnets()
    specs = args.specs.split(",")
    assistants = {spec: make_assistant(spec, bundle) for spec in specs}
    transcribe(bundle, audio[: SAMPLE_RATE * 20])  # warm-up
    times: dict[str, list[float]] = {spec: [] for spec in specs}
    reference = None
    for repeat in range(args.repeats):
        for spec in specs:
            start = time.perf_counter()
            result = transcribe(bundle, audio, assistant=assistants[spec])
            times[spec].append(time.perf_counter() - start)
            reference = reference if reference is not None else result.text
            s, g = result.stats, result.stats.generation
            print(f"{repeat} {spec:10s} {times[spec][-1]:6.2f} s  same words: {result.text == reference}  "
                  f"encoder {s.encode_seconds:.2f}  model {g.model_seconds:.2f}  assistant {g.assistant_seconds:.2f}  "
                  f"acceptance {g.acceptance_rate:.3f}  passes/token {g.model_forward_passes / g.generated_tokens:.3f}",
                  flush=True)
    base = float(np.median(times[specs[0]]))
    lines = ["| assistant | median s | RTF | speed-up |", "| --- | --- | --- | --- |"]
    for spec in specs:
        median = float(np.median(times[spec]))
        lines.append(f"| {spec} | {median:.2f} | {median / (len(audio) / SAMPLE_RATE):.3f} | {base / median:.2f}x |")
    print("\n" + "\n".join(lines))
    caption = f"The sonnets ({len(audio) / SAMPLE_RATE:.0f} s), medians of {args.repeats} interleaved runs."
    table = caption + "\n\n" + "\n".join(lines)
    write_figures(args.out, {"repeats": args.repeats, "audio_seconds": len(audio) / SAMPLE_RATE, "seconds": times},
                  table, command_line())


if __name__ == "__main__":
    main()
