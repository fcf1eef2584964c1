"""Scores `scripts/bench_gpu.py real` output here (the device image has no jiwer): WER per run, texts equal
to the float32 plain run, speed, and for assisted runs acceptance and model passes per token.

    python scripts/gpu_wer.py reports/gpu-real.json [--out docs/figures/gpu-real]

Prints the table and writes docs/figures/gpu-real.json and docs/figures/gpu-real.md (`--out` to change); the
machine recorded is the device the run was made on.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from benchlib import command_line, figure_path, write_figures

from eval.wer import word_error_rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("real", help="the JSON that `bench_gpu.py real` wrote")
    parser.add_argument("--out", default=str(figure_path("gpu-real")), help="writes OUT.json and OUT.md")
    args = parser.parse_args()
    data = json.loads(Path(args.real).read_text())
    references = data["references"]
    runs = data["runs"]
    baseline = runs[0]["texts"]
    print(f"device: {data['device']}\n")
    lines = [("| dtype | assistant | batch | clips | seconds | audio s / s | WER | texts = float32 plain | "
              "acceptance | model passes / token |"), "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    rows = []
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
        lines.append(f"| {run['dtype']} | {run['assistant']} | {run['batch_size']} | {len(keys)} | "
                     f"{run['seconds']:.2f} | {run['audio_seconds'] / run['seconds']:.1f} | {100 * wer:.2f} % | "
                     f"{same}/{len(keys)} | {acceptance} | {per_token} |")
        rows.append({"dtype": run["dtype"], "assistant": run["assistant"], "batch_size": run["batch_size"],
                     "clips": len(keys), "seconds": run["seconds"], "audio_seconds": run["audio_seconds"], "wer": wer,
                     "same_as_float32_plain": same, "acceptance": accepted / drafted if drafted else None,
                     "model_passes_per_token": passes / tokens if tokens else None})
    print("\n".join(lines))
    write_figures(args.out, {"source": args.real, "runs": rows}, "\n".join(lines), command_line(),
                  found={"device": data["device"]})


if __name__ == "__main__":
    main()
