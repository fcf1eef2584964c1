"""GPU checks: per-step costs of real large-model shapes, and fp16/bf16 speed and word parity on real weights.

    python scripts/bench_gpu.py shapes                    # -> docs/figures/gpu-shapes.{json,md}
    python scripts/bench_gpu.py shapes --device cpu --dtypes float32 --batches 1 --no-rounds --out cpu
    python scripts/bench_gpu.py real --model FOLDER --audio clips.npz   # on the GPU -> reports/gpu-real.json
    python scripts/bench_gpu.py score                     # here: WER of those -> docs/figures/gpu-real.{json,md}

`shapes` builds large-v3, distil-large-v3 (2 decoder layers) and large-v3-turbo (4) with random weights in
fp16/bf16 (their speed does not depend on the weights' values; `--family medium.en|small.en` for those pairs)
and times, through our decoder adapter, the encoder per window and one decoder pass of 1..9 tokens at batch 1
and 8, then the whole engine round with an identical assistant (everything accepted) against plain greedy,
which gives the per-round overhead. On a CPU (`--device cpu --dtypes float32 --batches 1 --no-rounds`) the
same step costs decide what `auto` picks there. Writes docs/figures/gpu-shapes.json and .md (with another
--family, gpu-shapes-FAMILY; `--out` to change).
(scripts/bench_graphs.py times the same shapes with and without CUDA graphs.)
`real` transcribes clips (16 kHz float32 arrays in an .npz, references in its `__refs__` entry as JSON) with a
real model folder on the GPU in float32, float16 and bfloat16, with and without a `self:` assistant, and writes
every hypothesis to --out (default reports/gpu-real.json); `score` scores them here (the device image has no
jiwer) and writes the figures (docs/figures/gpu-real.{json,md}). The device image lacks librosa and soundfile, which only
file decoding needs.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch
from benchlib import SAMPLE_RATE, command_line, figure_path, timed, write_figures

WIDTHS = (1, 2, 4, 6, 9)


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _device_name(device: str) -> str:
    return torch.cuda.get_device_name() if device.startswith("cuda") else device


def _timed(fn, repeats: int = 20) -> float:
    """Median seconds of `fn()` after three warm-ups, with the device synchronised around each call."""
    return float(timed(fn, repeats, warmup=3, sync=_sync))


# Real decoder shapes (random weights): the teacher first, its distil-whisper student last.
FAMILIES = {
    "large-v3": ({"d_model": 1280, "encoder_layers": 32, "encoder_attention_heads": 20, "decoder_attention_heads": 20,
                  "encoder_ffn_dim": 5120, "decoder_ffn_dim": 5120, "num_mel_bins": 128, "vocab_size": 51866},
                 [("large-v3", 32), ("turbo", 4), ("distil-large-v3", 2)]),
    "medium.en": ({"d_model": 1024, "encoder_layers": 24, "encoder_attention_heads": 16, "decoder_attention_heads": 16,
                   "encoder_ffn_dim": 4096, "decoder_ffn_dim": 4096, "num_mel_bins": 80, "vocab_size": 51864},
                  [("medium.en", 24), ("distil-medium.en", 2)]),
    "small.en": ({"d_model": 768, "encoder_layers": 12, "encoder_attention_heads": 12, "decoder_attention_heads": 12,
                  "encoder_ffn_dim": 3072, "decoder_ffn_dim": 3072, "num_mel_bins": 80, "vocab_size": 51864},
                 [("small.en", 12), ("distil-small.en", 4)]),
}


def _rounds(model: torch.nn.Module, draft_model: torch.nn.Module, encoder_output: torch.Tensor) -> dict:
    """Whole rounds: plain greedy vs a student and vs an identical assistant (all accepted), 128 tokens, batch 1."""
    from asr.whisper.decoder import WhisperDecoderAdapter
    from decoding import AssistantDraft
    from decoding.engine import GenerationOptions, generate

    options = GenerationOptions(max_new_tokens=128, schedule="constant", num_assistant_tokens=5)
    prompt = [50258, 50259, 50360, 50364]
    plain = _timed(lambda: generate(WhisperDecoderAdapter(model, encoder_output), prompt, options), 3)
    distil = _timed(lambda: generate(WhisperDecoderAdapter(model, encoder_output), prompt, options,
                                     AssistantDraft(WhisperDecoderAdapter(draft_model, encoder_output))), 3)
    same = _timed(lambda: generate(WhisperDecoderAdapter(model, encoder_output), prompt, options,
                                   AssistantDraft(WhisperDecoderAdapter(model, encoder_output))), 3)
    return {"plain_128_tokens_s": plain, "distil_random_128_tokens_s": distil, "identical_assistant_128_tokens_s": same}


def shapes_table(results: dict) -> str:
    """Milliseconds per decoder pass by dtype, batch and decoder; the encoder; whole rounds when measured."""
    lines = [f"{results['device']}, family {results['family']}, random weights; medians, milliseconds.", "",
             "| dtype | batch | encoder, whole batch | decoder | "
             + " | ".join(f"{w} token{'s' * (w > 1)}" for w in WIDTHS) + " |", "| --- | ---: | ---: | --- |" + " ---: |" * len(WIDTHS)]
    rounds = []
    for dtype_name, entry in results["dtypes"].items():
        batches = [int(k[len("encoder_b"):-2]) for k in entry if k.startswith("encoder_b")]
        for batch in batches:
            names = [k[: -len(f"_b{batch}_w1_ms")] for k in entry if k.endswith(f"_b{batch}_w1_ms")]
            for name in names:
                cells = [f"{entry[f'{name}_b{batch}_w{w}_ms']:.2f}" for w in WIDTHS]
                lines.append(f"| {dtype_name} | {batch} | {1000 * entry[f'encoder_b{batch}_s']:.1f} | {name} | "
                             + " | ".join(cells) + " |")
        if "plain_128_tokens_s" in entry:
            rounds.append(f"| {dtype_name} | {entry['plain_128_tokens_s']:.3f} | "
                          f"{entry['distil_random_128_tokens_s']:.3f} | "
                          f"{entry['identical_assistant_128_tokens_s']:.3f} |")
    if rounds:
        lines += ["", "128 tokens at batch 1, seconds (k = 5, constant):", "",
                  "| dtype | plain greedy | random-weight student assisting | identical assistant (all accepted) |",
                  "| --- | ---: | ---: | ---: |", *rounds]
    return "\n".join(lines)


def family_models(family: str, dtype: torch.dtype, device: str) -> dict[str, torch.nn.Module]:
    """A family's decoders (`FAMILIES`) with random weights, by name, the teacher first."""
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    shape, decoders = FAMILIES[family]
    teacher = decoders[0][0]
    models = {}
    for name, layers in decoders:
        with torch.device(device):
            # Only the teacher's encoder runs; the others read its output (a 1-layer encoder saves memory).
            config = WhisperConfig(**{**shape, "decoder_layers": layers,
                                      "encoder_layers": shape["encoder_layers"] if name == teacher else 1,
                                      "max_target_positions": 448, "max_source_positions": 1500})
            models[name] = WhisperForConditionalGeneration(config).to(dtype).eval()
    return models


def pass_ms(adapter, batch: int, device: str, widths: tuple[int, ...]) -> dict[int, float]:
    """Median milliseconds of `adapter`'s decoder pass of each width after a 100-token prompt (cropped back to
    it before every pass)."""
    cache = adapter.new_cache(batch)
    adapter.forward(torch.full((batch, 100), 400, device=device), cache, 1)
    times = {}
    for width in widths:
        ids = torch.full((batch, width), 400, device=device)

        def step(ids=ids, width=width) -> None:
            adapter.crop(cache, 100)
            adapter.forward(ids, cache, width)

        times[width] = 1000 * _timed(step)
    return times


def shapes(out: str, device: str, dtypes: list[str], batches: list[int], rounds: bool, family: str) -> None:
    from asr.whisper.decoder import WhisperDecoderAdapter
    from asr.whisper.window import encode

    shape, decoders = FAMILIES[family]
    teacher, student = decoders[0][0], decoders[-1][0]
    results: dict = {"device": _device_name(device), "family": family, "dtypes": {}}
    for dtype_name in dtypes:
        dtype = getattr(torch, dtype_name)
        models = family_models(family, dtype, device)
        features = torch.randn(max(batches), shape["num_mel_bins"], 3000, device=device, dtype=dtype)
        entry: dict = {}
        for batch in batches:
            encoder_output = encode(models[teacher], features[:batch])
            entry[f"encoder_b{batch}_s"] = _timed(
                lambda m=models[teacher], f=features, b=batch: encode(m, f[:b]), 5)
            for name, model in models.items():
                times = pass_ms(WhisperDecoderAdapter(model, encoder_output), batch, device, WIDTHS)
                entry.update({f"{name}_b{batch}_w{width}_ms": ms for width, ms in times.items()})
        if rounds:
            entry.update(_rounds(models[teacher], models[student], encode(models[teacher], features[:1])))
        results["dtypes"][dtype_name] = entry
        print(dtype_name, json.dumps(entry, indent=1), flush=True)
        models.clear()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    table = shapes_table(results)
    print(table)
    write_figures(out, results, table, command_line())


def real(model_dir: str, audio_path: str, out: str, device: str, limit: int | None) -> None:
    from asr.assist.choose import make_assistant
    from asr.transcription import transcribe, transcribe_many
    from asr.models.registry import load_model
    from asr.options import TranscribeOptions

    data = np.load(audio_path)
    references = json.loads(str(data["__refs__"]))
    # 16-bit PCM in the archive (the recordings are 16-bit), float32 here.
    clips = {key: data[key].astype(np.float32) / 32768 for key in data.files if key != "__refs__"}
    clips = dict(list(clips.items())[:limit]) if limit else clips
    longform = {k: v for k, v in clips.items() if len(v) > 30 * SAMPLE_RATE}
    short = {k: v for k, v in clips.items() if k not in longform}
    runs = [("float32", "none", 1), ("float32", "self:bf16", 1), ("float32", "self:fp16", 1),
            ("float16", "none", 1), ("bfloat16", "none", 1), ("float16", "none", 8), ("float32", "none", 8)]
    results: dict = {"device": _device_name(device), "runs": [], "references": references}
    options = TranscribeOptions(language="en")
    bundles = {}
    for dtype_name, spec, batch in runs:
        dtype = getattr(torch, dtype_name)
        if dtype_name not in bundles:
            bundles[dtype_name] = load_model(model_dir, device=device, dtype=dtype)
        bundle = bundles[dtype_name]
        assistant = make_assistant(spec, bundle, device=device, dtype=dtype)
        transcribe(bundle, next(iter(short.values())), options, assistant)  # warm-up
        texts, seconds, stats = {}, {}, {}
        _sync()
        start = time.perf_counter()
        if batch == 1:
            for key, audio in clips.items():
                t0 = time.perf_counter()
                result = transcribe(bundle, audio, options, assistant)
                _sync()
                texts[key], seconds[key] = result.text, time.perf_counter() - t0
                stats[key] = result.stats.to_dict()
        else:
            keys = list(short)
            for key, result in zip(keys, transcribe_many(bundle, [short[k] for k in keys], options, assistant,
                                                         batch_size=batch)):
                texts[key] = result.text
        _sync()
        total = time.perf_counter() - start
        run = {"dtype": dtype_name, "assistant": spec, "batch_size": batch, "seconds": total,
               "audio_seconds": sum(len(clips[k]) for k in texts) / SAMPLE_RATE, "texts": texts, "clip_seconds": seconds,
               "stats": stats}
        results["runs"].append(run)
        print(dtype_name, spec, batch, f"{total:.2f} s", flush=True)
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(results, indent=1))


def score(real_json: str, out: str) -> None:
    """Scores `real`'s hypotheses here (the device image has no jiwer): WER per run, texts equal to the float32
    plain run, speed, and for assisted runs acceptance and model passes per token."""
    from eval.wer import word_error_rate

    data = json.loads(Path(real_json).read_text())
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
    write_figures(out, {"source": real_json, "runs": rows}, "\n".join(lines), command_line(),
                  found={"device": data["device"]})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=["shapes", "real", "score"])
    parser.add_argument("--model")
    parser.add_argument("--audio")
    parser.add_argument("--out", help="shapes: figure files OUT.json and OUT.md (default docs/figures/gpu-shapes); "
                                       "real: the hypotheses' JSON (default reports/gpu-real.json)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--limit", type=int, help="only the first N clips (smoke runs)")
    parser.add_argument("--dtypes", default="float16,bfloat16", help="shapes: comma-separated torch dtypes")
    parser.add_argument("--batches", default="1,8", help="shapes: comma-separated batch sizes")
    parser.add_argument("--no-rounds", action="store_true", help="shapes: skip the whole-round timings")
    parser.add_argument("--family", default="large-v3", choices=list(FAMILIES), help="shapes: which model family")
    parser.add_argument("--threads", type=int, help="torch CPU threads")
    parser.add_argument("--hypotheses", default="reports/gpu-real.json", help="score: the JSON that `real` wrote")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.mode == "shapes":
        name = "gpu-shapes" if args.family == "large-v3" else f"gpu-shapes-{args.family}"
        shapes(args.out or str(figure_path(name)), args.device, args.dtypes.split(","),
               [int(b) for b in args.batches.split(",")],
               not args.no_rounds, args.family)
    elif args.mode == "real":
        real(args.model, args.audio, args.out or "reports/gpu-real.json", args.device, args.limit)
    else:
        score(args.hypotheses, args.out or str(figure_path("gpu-real")))


if __name__ == "__main__":
    main()
