"""Side-by-side timing of every assistant available here on the sonnets (158 s), ours only, interleaved.

    python scripts/bench_pairings.py [--repeats 2] [--threads 2] [--specs none,self:int8,self:bf16,tiny.en,self]

Prints, per run, wall time, encoder / model / assistant seconds, acceptance and model passes per token, and
at the end the median wall time and speed-up against plain greedy. `scripts/bench_longform.sh` adds
transformers' and faster-whisper's figures through `asr eval`.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch

from asr.assist.choose import make_assistant
from asr.models.registry import load_model
from asr.transcribe import transcribe
from audio import load_audio

EVALDATA = Path(__file__).resolve().parents[2] / "shared" / "evaldata"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--specs", default="none,self:int8,self:bf16,tiny.en,self")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    bundle = load_model("base")
    audio = np.concatenate([load_audio(EVALDATA / "longform" / f"p00{i}.mp3") for i in (1, 2, 3)])
    specs = args.specs.split(",")
    assistants = {spec: make_assistant(spec, bundle) for spec in specs}
    transcribe(bundle, audio[: 16000 * 20])  # warm-up
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
    print("\n| assistant | median s | RTF | speed-up |\n| --- | --- | --- | --- |")
    for spec in specs:
        median = float(np.median(times[spec]))
        print(f"| {spec} | {median:.2f} | {median / (len(audio) / 16000):.3f} | {base / median:.2f}x |")


if __name__ == "__main__":
    main()
