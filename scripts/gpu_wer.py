"""Scores `scripts/bench_gpu.py real` output here (the device image has no jiwer): WER per run, texts equal
to the float32 plain run, speed, and for assisted runs acceptance and model passes per token.

    python scripts/gpu_wer.py real.json
"""

from __future__ import annotations

import json
import sys

from eval.wer import word_error_rate


def main() -> None:
    data = json.load(open(sys.argv[1]))
    references = data["references"]
    runs = data["runs"]
    baseline = runs[0]["texts"]
    print(f"device: {data['device']}\n")
    print("| dtype | assistant | batch | clips | seconds | audio s / s | WER | texts = float32 plain | "
          "acceptance | model passes / token |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for run in runs:
        keys = list(run["texts"])
        wer = word_error_rate([references[k] for k in keys], [run["texts"][k] for k in keys])
        same = sum(run["texts"][k] == baseline[k] for k in keys)
        drafted = accepted = passes = tokens = 0
        for generation in (run.get("stats") or {}).values():
            drafted += generation.get("drafted_tokens", 0)
            accepted += generation.get("accepted_tokens", 0)
            passes += generation.get("model_forward_passes", 0)
            tokens += generation.get("generated_tokens", 0)
        acceptance = f"{accepted / drafted:.3f}" if drafted else "-"
        per_token = f"{passes / tokens:.3f}" if tokens else "-"
        print(f"| {run['dtype']} | {run['assistant']} | {run['batch_size']} | {len(keys)} | {run['seconds']:.2f} | "
              f"{run['audio_seconds'] / run['seconds']:.1f} | {100 * wer:.2f} % | {same}/{len(keys)} | "
              f"{acceptance} | {per_token} |")


if __name__ == "__main__":
    main()
