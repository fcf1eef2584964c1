"""A bfloat16 encoder's attention through decoding.kernels.encoder_attention against PyTorch's SDPA, for `base`.

    python scripts/bench_encoder_attention.py [--threads 2] [--repeats 15] [--out docs/figures/encoder-attention]
    python scripts/bench_encoder_attention.py --parts calls,windows   (no transcriptions: a minute)

1. One attention call as base's encoder makes it (8 heads over 1,500 frames, 64 wide): SDPA in float32, SDPA in
   bfloat16, the native kernel (bfloat16), interleaved, ms medians.
2. One encoder window (the first 30 s of the second sonnet): the float32 model's encoder, and the int8 model's
   bfloat16 encoder with SDPA (`pytorch_attention()`) and with the kernel, interleaved, ms medians.
3. `--dtype int8` transcriptions of the evaluation recordings of ../shared/evaldata fit for WER (the 65 English
   ones and those in other languages), each with both attentions in turn in one process (which goes first
   alternates): the same text on how many, WER (English; the others), whole seconds and encoder seconds.

Writes docs/figures/encoder-attention.json and .md (`--out` to change); `--parts` runs some of calls, windows,
words. The kernel runs where the CPU has AVX512-BF16 and no AMX (`encoder_attention.available()`); elsewhere the
script says so and stops.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F
from benchlib import EVALDATA, command_line, figure_path, machine, use_threads, wer_items, write_figures

from asr.models.registry import load_model
from asr.options import TranscribeOptions
from asr.transcription import transcribe
from audio.load import load_audio
from decoding.kernels import encoder_attention
from eval.wer import ErrorCounts, error_counts

PARTS = ("calls", "windows", "words")
FOLDERS = ("librispeech", "ljspeech", "fleurs", "clips", "spontaneous", "longform", "multilingual")


def medians_ms(candidates: dict, repeats: int) -> dict[str, float]:
    """Each callable's median time in ms, called in turn (interleaved) after one warm-up call each."""
    for fn in candidates.values():
        fn()
    times = {name: [] for name in candidates}
    for _ in range(repeats):
        for name, fn in candidates.items():
            start = time.perf_counter()
            fn()
            times[name].append((time.perf_counter() - start) * 1e3)
    return {name: round(statistics.median(t), 2) for name, t in times.items()}


def calls(repeats: int) -> dict[str, float]:
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 8, 1500, 64, generator=generator) for _ in range(3))
    qb, kb, vb = (t.bfloat16() for t in (q, k, v))
    return medians_ms({"SDPA float32": lambda: F.scaled_dot_product_attention(q, k, v),
                       "SDPA bfloat16": lambda: F.scaled_dot_product_attention(qb, kb, vb),
                       "native bfloat16": lambda: encoder_attention.attention(qb, kb, vb, 0.125)}, repeats)


def windows(repeats: int) -> dict[str, float]:
    plain, int8 = load_model("base"), load_model("base", dtype="int8")
    samples = load_audio(EVALDATA / "longform" / "p002.mp3")[: 30 * 16000]
    features = plain.feature_extractor(samples, sampling_rate=16000, return_tensors="pt").input_features
    encoder, encoder8 = plain.model.get_encoder(), int8.model.get_encoder()

    def pytorch() -> None:
        with encoder_attention.pytorch_attention():
            encoder8(features.bfloat16())

    with torch.inference_mode():
        return medians_ms({"float32 (SDPA)": lambda: encoder(features),
                           "int8 model, bfloat16, SDPA": pytorch,
                           "int8 model, bfloat16, native": lambda: encoder8(features.bfloat16())}, repeats)


def words() -> dict:
    bundle = load_model("base", dtype="int8")
    items = wer_items(FOLDERS, language=None)
    found = {mode: {"seconds": 0.0, "encode_seconds": 0.0, "texts": []} for mode in ("SDPA", "native")}
    for n, item in enumerate(items):
        audio = load_audio(item["audio"])
        for mode in (("SDPA", "native") if n % 2 == 0 else ("native", "SDPA")):
            with encoder_attention.pytorch_attention(mode == "SDPA"):
                start = time.perf_counter()
                result = transcribe(bundle, audio, TranscribeOptions(language=item["language"]))
                found[mode]["seconds"] += time.perf_counter() - start
            found[mode]["encode_seconds"] += result.stats.encode_seconds
            found[mode]["texts"].append(result.text)
    summary = {"recordings": len(items),
               "same_text": sum(a == b for a, b in zip(found["SDPA"]["texts"], found["native"]["texts"]))}
    for mode, run in found.items():
        for group, english in (("english", True), ("other", False)):
            counts = [error_counts([item["text"]], [text], item["language"])
                      for item, text in zip(items, run["texts"]) if (item["language"] == "en") == english]
            summary[f"{mode}_wer_{group}"] = round(100 * sum(counts, ErrorCounts()).rate, 2)
        summary[f"{mode}_seconds"] = round(run["seconds"], 2)
        summary[f"{mode}_encode_seconds"] = round(run["encode_seconds"], 2)
    summary["changed"] = [{"id": item["id"], "SDPA": a, "native": b} for item, a, b
                          in zip(items, found["SDPA"]["texts"], found["native"]["texts"]) if a != b]
    return summary


def table(data: dict) -> str:
    lines = []
    if "calls" in data:
        lines += ["| one attention call of base's encoder (8 heads, 1,500 frames) | ms |", "| --- | ---: |"]
        lines += [f"| {name} | {ms:.2f} |" for name, ms in data["calls"].items()]
        lines.append("")
    if "windows" in data:
        lines += ["| base's encoder, one 30 s window | ms |", "| --- | ---: |"]
        lines += [f"| {name} | {ms:.1f} |" for name, ms in data["windows"].items()]
        lines.append("")
    if "words" in data:
        w = data["words"]
        lines += [f"`--dtype int8` on {w['recordings']} recordings, both attentions in one process:", "",
                  "| attention | WER English | WER other languages | seconds | encoder seconds |",
                  "| --- | ---: | ---: | ---: | ---: |"]
        for mode in ("SDPA", "native"):
            lines.append(f"| {mode} | {w[f'{mode}_wer_english']:.2f} % | {w[f'{mode}_wer_other']:.2f} % | "
                         f"{w[f'{mode}_seconds']:.1f} | {w[f'{mode}_encode_seconds']:.1f} |")
        lines += ["", f"The same text on {w['same_text']} of {w['recordings']} recordings."]
    return "\n".join(lines).rstrip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--out", default=str(figure_path("encoder-attention")), help="writes OUT.json and OUT.md")
    parser.add_argument("--parts", default=",".join(PARTS), help=f"which of {', '.join(PARTS)} (comma-separated)")
    args = parser.parse_args()
    use_threads(args.threads)
    if not encoder_attention.available():
        raise SystemExit("the native encoder attention does not run here (no C compiler, no AVX512-BF16, or AMX)")
    parts = args.parts.split(",")
    if set(parts) - set(PARTS):
        parser.error(f"--parts: unknown {sorted(set(parts) - set(PARTS))}")
    run = {"calls": lambda: calls(args.repeats), "windows": lambda: windows(args.repeats), "words": words}
    data = {part: run[part]() for part in PARTS if part in parts}
    write_figures(args.out, data, table(data), command_line("bench_encoder_attention.py"), machine())


if __name__ == "__main__":
    main()
