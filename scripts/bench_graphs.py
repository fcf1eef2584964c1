"""CUDA graphs on a GPU: decoder passes replayed as graphs (`decoding.kernels.graphed_step`) against the layers launched
one by one, on real shapes with random weights.

    python scripts/bench_graphs.py                         # large-v3 shapes -> docs/figures/gpu-graphs.{json,md}
    python scripts/bench_graphs.py --family medium.en      # -> docs/figures/gpu-graphs-medium.en.{json,md}

Builds a family's teacher and its distil-whisper student (scripts/bench_gpu.py's FAMILIES; fp16 and bf16 by
default) and times a pass of 1..9 tokens through each decoder with graphs and without, at batch 1 and 8; then
128-token rounds at batch 1 (plain greedy, the random-weight student assisting, an identical assistant) both ways,
whether their tokens are the same both ways, and the cost model of docs/design.md at acceptance 0.8 and k = 5
over the step costs with and without graphs. The speed does not depend on the weights' values (design.md §8).
"""

from __future__ import annotations

import argparse
import json

import torch
from bench_gpu import FAMILIES, _device_name, _sync, family_models, pass_ms
from benchlib import command_line, figure_path, timed, write_figures

GRAPH_WIDTHS = (1, 2, 4, 6, 9)


def _adapter(model: torch.nn.Module, encoder_output: torch.Tensor, graphs: bool):
    from asr.whisper.decoder import WhisperDecoderAdapter

    adapter = WhisperDecoderAdapter(model, encoder_output)
    if not graphs:
        adapter.graphs = None
    return adapter


def _round_tokens(model: torch.nn.Module, draft_model: torch.nn.Module | None, encoder_output: torch.Tensor,
                  graphs: bool) -> tuple[float, list[int], dict]:
    """Seconds for 128 tokens at batch 1 (k = 5, constant), the tokens, the statistics."""
    from decoding import AssistantDraft
    from decoding.engine import GenerationOptions, generate

    options = GenerationOptions(max_new_tokens=128, schedule="constant", num_assistant_tokens=5)
    prompt = [50258, 50259, 50360, 50364]
    results: list = []

    def run():
        draft = AssistantDraft(_adapter(draft_model, encoder_output, graphs)) if draft_model is not None else None
        return generate(_adapter(model, encoder_output, graphs), prompt, options, draft)

    seconds = float(timed(run, 3, warmup=2, sync=_sync, results=results))
    return seconds, results[-1].tokens, results[-1].stats.to_dict()


def _per_token_ms(step_ms: dict, draft_ms: float, acceptance: float, k: int) -> float:
    """design.md's cost model: a round of k drafts and one check of k + 1 tokens yields (1 - a^(k+1)) / (1 - a)
    tokens on average."""
    tokens = (1 - acceptance ** (k + 1)) / (1 - acceptance)
    return (k * draft_ms + step_ms[k + 1]) / tokens


def graph_table(results: dict) -> str:
    lines = [f"{results['device']}, family {results['family']}, random weights; medians, milliseconds per decoder "
             "pass (layers launched one by one / replayed graph).", "",
             "| dtype | batch | decoder | " + " | ".join(f"{w} token{'s' * (w > 1)}" for w in GRAPH_WIDTHS)
             + " | 1 token, speed-up |", "| --- | ---: | --- |" + " ---: |" * (len(GRAPH_WIDTHS) + 1)]
    for dtype_name, entry in results["dtypes"].items():
        for key, row in entry["steps"].items():
            batch, name = key.split(":", 1)
            cells = [f"{row['layers'][str(w)]:.2f} / {row['graphs'][str(w)]:.2f}" for w in GRAPH_WIDTHS]
            lines.append(f"| {dtype_name} | {batch} | {name} | " + " | ".join(cells)
                         + f" | {row['layers']['1'] / row['graphs']['1']:.1f}x |")
    lines += ["", "128 tokens at batch 1 (k = 5, constant), seconds: layers / graphs (tokens the same both ways):",
              "", "| dtype | plain greedy | random student assisting | identical assistant (all accepted) |",
              "| --- | ---: | ---: | ---: |"]
    for dtype_name, entry in results["dtypes"].items():
        cells = [f"{r['layers_s']:.3f} / {r['graphs_s']:.3f} ({'same' if r['same_tokens'] else 'DIFFERENT'})"
                 for r in entry["rounds"].values()]
        lines.append(f"| {dtype_name} | " + " | ".join(cells) + " |")
    lines += ["", "Cost model (design.md) at acceptance 0.8, k = 5, over these step costs, ms per token:", "",
              "| dtype | greedy, layers | greedy, graphs | distil-assisted, layers | distil-assisted, graphs |",
              "| --- | ---: | ---: | ---: | ---: |"]
    for dtype_name, entry in results["dtypes"].items():
        model = entry["cost_model"]
        lines.append(f"| {dtype_name} | {model['greedy_layers_ms']:.2f} | {model['greedy_graphs_ms']:.2f} | "
                     f"{model['assisted_layers_ms']:.2f} | {model['assisted_graphs_ms']:.2f} |")
    return "\n".join(lines)


def graphs(out: str, device: str, dtypes: list[str], batches: list[int], family: str) -> None:
    """Decoder passes and rounds with and without CUDA graphs (see the module's docstring)."""
    from asr.whisper.window import encode

    shape, decoders = FAMILIES[family]
    teacher, student = decoders[0][0], decoders[-1][0]
    results: dict = {"device": _device_name(device), "family": family, "dtypes": {}}
    for dtype_name in dtypes:
        dtype = getattr(torch, dtype_name)
        models = family_models(family, dtype, device)
        features = torch.randn(max(batches), shape["num_mel_bins"], 3000, device=device, dtype=dtype)
        entry: dict = {"steps": {}, "rounds": {}}
        for batch in batches:
            encoder_output = encode(models[teacher], features[:batch])
            for name, model in models.items():
                row = {kind: {str(w): ms for w, ms in pass_ms(_adapter(model, encoder_output, kind == "graphs"),
                                                               batch, device, GRAPH_WIDTHS).items()}
                       for kind in ("layers", "graphs")}
                entry["steps"][f"{batch}:{name}"] = row
                print(dtype_name, batch, name, json.dumps(row), flush=True)
        encoder_output = encode(models[teacher], features[:1])
        for label, draft_model in (("plain", None), ("student", models[student]), ("identical", models[teacher])):
            layers_s, layers_tokens, _ = _round_tokens(models[teacher], draft_model, encoder_output, False)
            graphs_s, graphs_tokens, stats = _round_tokens(models[teacher], draft_model, encoder_output, True)
            entry["rounds"][label] = {"layers_s": layers_s, "graphs_s": graphs_s,
                                      "same_tokens": layers_tokens == graphs_tokens, "graphs_stats": stats}
            print(dtype_name, label, entry["rounds"][label], flush=True)
        steps = entry["steps"]
        big, small = steps[f"1:{teacher}"], steps[f"1:{student}"]
        entry["cost_model"] = {
            "greedy_layers_ms": big["layers"]["1"], "greedy_graphs_ms": big["graphs"]["1"],
            "assisted_layers_ms": _per_token_ms({int(w): v for w, v in big["layers"].items()},
                                                small["layers"]["1"], 0.8, 5),
            "assisted_graphs_ms": _per_token_ms({int(w): v for w, v in big["graphs"].items()},
                                                small["graphs"]["1"], 0.8, 5),
        }
        results["dtypes"][dtype_name] = entry
        models.clear()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    table = graph_table(results)
    print(table)
    write_figures(out, results, table, command_line())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", help="figure files OUT.json and OUT.md (default docs/figures/gpu-graphs[-FAMILY])")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtypes", default="float16,bfloat16", help="comma-separated torch dtypes")
    parser.add_argument("--batches", default="1,8", help="comma-separated batch sizes")
    parser.add_argument("--family", default="large-v3", choices=list(FAMILIES))
    args = parser.parse_args()
    name = "gpu-graphs" if args.family == "large-v3" else f"gpu-graphs-{args.family}"
    graphs(args.out or str(figure_path(name)), args.device, args.dtypes.split(","),
           [int(b) for b in args.batches.split(",")], args.family)


if __name__ == "__main__":
    main()
