"""What decoding.kernels.native's row-by-row products save against oneDNN's, per product and per decoder step of `base`.

    python scripts/bench_native.py [--threads 2] [--repeats 30] [--out docs/figures/native]
    python scripts/bench_native.py --parts steps --widths 1,4,8,17,24,32 --out docs/figures/native-widths
    python scripts/bench_native.py --parts steps,prompts --widths 1,8,24,32,64 --out docs/figures/native-prompt

1. Each of base's decoder product shapes (and its head in float32 and bfloat16) for 1 and 4 rows, over as many
   distinct weights as fill ~100 MB, so that every call reads its weight from memory as in a step: oneDNN over
   the dense weight, oneDNN over its packed copy, and decoding.kernels.native; microseconds and GB/s of weight read.
2. Int8 weights (one scale per row) for 1 and 4 rows: PyTorch's `_weight_int8pack_mm` (bfloat16 rows, the
   `--dtype int8` model's kernel without decoding.kernels.native) against decoding.kernels.native's (float32 rows).
3. A decoder step on the first 30 s of the second sonnet at position ~45, one token and a check of 3 drafts
   (4 rows; `--widths` for others), the head screened and in full, with decoding.kernels.native (the step up to
   `native_step.PACKED_ROWS` tokens for `base`) against `onednn_only()`, in turn, as medians;
   and one-token steps of the int8 model and of `base-draft:int8` (each built under either kernel choice).
5. A window's prompt pass (`--prompt-widths` tokens) through the native step against the layers over oneDNN.

Writes docs/figures/native.json and .md (`--out` to change); `--parts` runs some of the five (products,
int8_products, steps, one_token_steps, prompts).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from benchlib import EVALDATA, command_line, figure_path, machine, use_threads, write_figures

from asr.models.registry import load_model
from asr.whisper.decoder import WhisperDecoderAdapter
from asr.whisper.window import encode
from audio.load import load_audio
from decoding.kernels import native
from decoding.kernels.products import full_head, onednn_only

SHAPES = {"attention projection 512 x 512": (512, 512), "fc1 2048 x 512": (2048, 512),
          "fc2 512 x 2048": (512, 2048), "head 51,865 x 512": (51865, 512)}


def per_call_us(fn, count: int, repeats: int) -> float:
    """Median over `repeats` sweeps of the mean time of one call, calling fn(0..count-1) in turn."""
    for i in range(count):
        fn(i)
    sweeps = []
    for _ in range(repeats):
        start = time.perf_counter()
        for i in range(count):
            fn(i)
        sweeps.append((time.perf_counter() - start) / count)
    return statistics.median(sweeps) * 1e6


def products(repeats: int) -> list[dict]:
    onednn = torch.ops.mkldnn._linear_pointwise
    found = []
    for name, (rows_out, width) in SHAPES.items():
        for dtype in ((torch.float32, torch.bfloat16) if name.startswith("head") else (torch.float32,)):
            count = max(1, int(100e6 // (rows_out * width * 4)))
            weights = [torch.randn(rows_out, width).to(dtype) for _ in range(count)]
            packed = [torch.ops.mkldnn._reorder_linear_weight(w) for w in weights]
            megabytes = rows_out * width * weights[0].element_size() / 1e6
            for rows in (1, 4):
                x = torch.randn(rows, width)
                xo = x.to(dtype)
                times = {
                    "oneDNN dense": per_call_us(lambda i: onednn(xo, weights[i], None, "none", [], ""), count, repeats),
                    "oneDNN packed": per_call_us(lambda i: onednn(xo, packed[i], None, "none", [], ""), count, repeats),
                    "native": per_call_us(lambda i: native.rowdot(x, weights[i]), count, repeats),
                }
                found.append({"product": name, "dtype": str(dtype).removeprefix("torch."), "rows": rows,
                              "weight_mb": round(megabytes, 2), "us": {k: round(v, 1) for k, v in times.items()},
                              "gb_per_s": {k: round(megabytes / v * 1e3, 1) for k, v in times.items()}})
                print(found[-1], flush=True)
    return found


def int8_products(repeats: int) -> list[dict]:
    found = []
    for name, (rows_out, width) in {**SHAPES, "draft head 17,608 x 512": (17608, 512)}.items():
        count = max(1, int(100e6 // (rows_out * width)))
        weights = [torch.randint(-127, 128, (rows_out, width), dtype=torch.int8) for _ in range(count)]
        scales = [torch.rand(rows_out) / 100 for _ in range(count)]
        low_scales = [scale.bfloat16() for scale in scales]
        megabytes = rows_out * width / 1e6
        for rows in (1, 4):
            x = torch.randn(rows, width)
            low = x.bfloat16()
            times = {
                "PyTorch int8": per_call_us(
                    lambda i: torch.ops.aten._weight_int8pack_mm(low, weights[i], low_scales[i]), count, repeats),
                "native": per_call_us(lambda i: native.rowdot(x, weights[i], None, scales[i]), count, repeats),
            }
            found.append({"product": name, "rows": rows, "weight_mb": round(megabytes, 2),
                          "us": {k: round(v, 1) for k, v in times.items()},
                          "gb_per_s": {k: round(megabytes / v * 1e3, 1) for k, v in times.items()}})
            print(found[-1], flush=True)
    return found


def one_token_steps(repeats: int) -> list[dict]:
    """One-token steps of the int8 model and of base-draft:int8, each built and run with and without native."""
    from asr.assist.choose import make_assistant
    from asr.models.precision import INT8

    float32 = load_model("base")
    int8 = {kernels: None for kernels in ("native", "oneDNN")}
    drafts = dict(int8)
    for kernels in int8:
        with onednn_only(kernels == "oneDNN"):
            int8[kernels] = load_model("base", dtype=INT8).model
            drafts[kernels] = make_assistant("base-draft:int8", float32).decoder_model
    samples = load_audio(str(EVALDATA / "longform" / "p002.mp3"))[:30 * 16000]
    features = float32.feature_extractor(samples, sampling_rate=16000, return_tensors="pt").input_features
    prompt = torch.tensor([[50258, 50259, 50359, 50363] + list(range(400, 440))])
    outputs = {"int8": encode(int8["native"], features), "base-draft:int8": encode(float32.model, features)}

    def step_ms(module, encoder_output, kernels: str, tokens: int = 20) -> float:
        with onednn_only(kernels == "oneDNN"):
            decoder = WhisperDecoderAdapter(module, encoder_output)
            cache = decoder.new_cache(1)
            decoder.forward(prompt, cache, 1)
            start = time.perf_counter()
            for i in range(tokens):
                decoder.forward(torch.full((1, 1), 500 + i), cache, 1)
            return (time.perf_counter() - start) / tokens * 1e3

    found = []
    for what, modules in (("int8", int8), ("base-draft:int8", drafts)):
        times: dict[str, list[float]] = {kernels: [] for kernels in modules}
        for _ in range(repeats):
            for kernels, module in modules.items():
                times[kernels].append(step_ms(module, outputs[what], kernels))
        native_ms, onednn_ms = statistics.median(times["native"]), statistics.median(times["oneDNN"])
        found.append({"decoder": what, "native_ms": round(native_ms, 2), "onednn_ms": round(onednn_ms, 2),
                      "speedup": round(onednn_ms / native_ms, 2)})
        print(found[-1], flush=True)
    return found


def _window() -> tuple:
    """`base`, its encoder output for the first 30 s of the second sonnet."""
    bundle = load_model("base")
    samples = load_audio(str(EVALDATA / "longform" / "p002.mp3"))[:30 * 16000]
    features = bundle.feature_extractor(samples, sampling_rate=16000, return_tensors="pt").input_features
    return bundle, encode(bundle.model, features)


def steps(repeats: int, widths: list[int]) -> list[dict]:
    bundle, encoder_output = _window()
    model = bundle.model
    exact = list(range(bundle.special.eot, model.config.vocab_size))
    prompt = torch.tensor([[50258, 50259, 50359, 50363] + list(range(400, 440))])
    configurations = {}
    for head in ("screened", "full"):
        for kernels in ("native", "oneDNN"):
            with onednn_only(kernels == "oneDNN"), full_head(head == "full"):
                decoder = WhisperDecoderAdapter(model, encoder_output)
                configurations[(head, kernels)] = decoder.screened(exact) if head == "screened" else decoder

    def step_ms(head: str, kernels: str, rows: int) -> float:
        tokens = min(20, (448 - prompt.shape[1]) // rows)  # within the decoder's 448 positions
        decoder = configurations[(head, kernels)]
        with onednn_only(kernels == "oneDNN"), full_head(head == "full"):
            cache = decoder.new_cache(1)
            decoder.forward(prompt, cache, 1)
            start = time.perf_counter()
            for i in range(tokens):
                decoder.forward(torch.full((1, rows), 500 + i), cache, rows)
            return (time.perf_counter() - start) / tokens * 1e3

    found = []
    for rows in widths:
        times: dict[tuple[str, str], list[float]] = {key: [] for key in configurations}
        for _ in range(repeats):
            for key in configurations:
                times[key].append(step_ms(*key, rows))
        for head in ("screened", "full"):
            native_ms = statistics.median(times[(head, "native")])
            onednn_ms = statistics.median(times[(head, "oneDNN")])
            found.append({"rows": rows, "head": head, "native_ms": round(native_ms, 2),
                          "onednn_ms": round(onednn_ms, 2), "speedup": round(onednn_ms / native_ms, 2)})
            print(found[-1], flush=True)
    return found


def prompts(repeats: int, widths: list[int]) -> list[dict]:
    """A window's prompt pass (previous text, then the start of transcript; logits of the last token) over an
    empty cache, through the native step against the layers over oneDNN, in turn, as medians."""
    bundle, encoder_output = _window()
    decoders = {}
    for kernels in ("native", "oneDNN"):
        with onednn_only(kernels == "oneDNN"):
            decoders[kernels] = WhisperDecoderAdapter(bundle.model, encoder_output)

    def pass_ms(kernels: str, prompt: torch.Tensor) -> float:
        with onednn_only(kernels == "oneDNN"):
            cache = decoders[kernels].new_cache(1)
            start = time.perf_counter()
            decoders[kernels].forward(prompt, cache, 1)
            return (time.perf_counter() - start) * 1e3

    found = []
    for width in widths:
        prompt = torch.tensor([[50361] + list(range(400, 400 + width - 4)) + [50258, 50259, 50359]])
        times: dict[str, list[float]] = {kernels: [] for kernels in decoders}
        for _ in range(repeats):
            for kernels in decoders:
                times[kernels].append(pass_ms(kernels, prompt))
        native_ms, onednn_ms = statistics.median(times["native"]), statistics.median(times["oneDNN"])
        found.append({"tokens": width, "native_ms": round(native_ms, 2), "onednn_ms": round(onednn_ms, 2),
                      "speedup": round(onednn_ms / native_ms, 2)})
        print(found[-1], flush=True)
    return found


PARTS = ("products", "int8_products", "steps", "one_token_steps", "prompts")


def table(data: dict) -> str:
    lines = []
    if data.get("products"):
        lines += ["| product | weight | rows | oneDNN dense | oneDNN packed | native | native GB/s |",
                  "| --- | --- | ---: | ---: | ---: | ---: | ---: |"]
        for row in data["products"]:
            us = row["us"]
            lines.append(f"| {row['product']} | {row['dtype']}, {row['weight_mb']} MB | {row['rows']} | "
                         f"{us['oneDNN dense']:.0f} us | {us['oneDNN packed']:.0f} us | {us['native']:.0f} us | "
                         f"{row['gb_per_s']['native']} |")
        lines.append("")
    lines += ["| decoder step of base | head | oneDNN ms | native ms | speed-up |",
              "| --- | --- | ---: | ---: | ---: |"]
    for row in data.get("steps", []):
        what = "one token" if row["rows"] == 1 else f"check of {row['rows'] - 1} drafts"
        lines.append(f"| {what} | {row['head']} | {row['onednn_ms']:.2f} | {row['native_ms']:.2f} | "
                     f"{row['speedup']:.2f}x |")
    for row in data.get("prompts", []):
        lines.append(f"| prompt pass, {row['tokens']} tokens | last row | {row['onednn_ms']:.2f} | "
                     f"{row['native_ms']:.2f} | {row['speedup']:.2f}x |")
    for row in data.get("one_token_steps", []):
        lines.append(f"| one token, {row['decoder']} | | {row['onednn_ms']:.2f} | {row['native_ms']:.2f} | "
                     f"{row['speedup']:.2f}x |")
    if data.get("int8_products"):
        lines += ["", "| int8 product | weight | rows | PyTorch int8 (bfloat16 rows) | native (float32 rows) "
                  "| native GB/s |", "| --- | --- | ---: | ---: | ---: | ---: |"]
        for row in data["int8_products"]:
            us = row["us"]
            lines.append(f"| {row['product']} | int8, {row['weight_mb']} MB | {row['rows']} | "
                         f"{us['PyTorch int8']:.0f} us | {us['native']:.0f} us | {row['gb_per_s']['native']} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--out", default=str(figure_path("native")), help="writes OUT.json and OUT.md")
    parser.add_argument("--parts", default=",".join(PARTS), help=f"which of {', '.join(PARTS)} (comma-separated)")
    parser.add_argument("--widths", default="1,4", help="tokens a step of part 3 feeds (comma-separated)")
    parser.add_argument("--prompt-widths", default="20,48,100,224", help="tokens of the prompts of part 5")
    args = parser.parse_args()
    use_threads(args.threads)
    if native.library() is None:
        raise SystemExit("decoding.kernels.native could not be built here (no C compiler?)")
    parts = args.parts.split(",")
    if set(parts) - set(PARTS):
        parser.error(f"--parts: unknown {sorted(set(parts) - set(PARTS))}")
    fewer = max(3, args.repeats // 4)
    run = {"products": lambda: products(args.repeats), "int8_products": lambda: int8_products(args.repeats),
           "steps": lambda: steps(fewer, [int(w) for w in args.widths.split(",")]),
           "one_token_steps": lambda: one_token_steps(fewer),
           "prompts": lambda: prompts(fewer, [int(w) for w in args.prompt_widths.split(",")])}
    data = {part: run[part]() for part in PARTS if part in parts}
    write_figures(args.out, data, table(data), command_line("bench_native.py"), machine())


if __name__ == "__main__":
    main()
