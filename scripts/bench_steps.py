"""Where a CPU's time goes for `base`: the fp32 peak, the encoder, model passes and an int8 draft step.

    python scripts/bench_steps.py [--threads 2] [--out docs/figures/steps]

Prints, and writes to docs/figures/steps.json and docs/figures/steps.md (`--out` to change; the README's
figures under "Batch transcription" and "What `auto` picks"):
- the fp32 and bf16 throughput of a 2048^3 matrix product, the machine's practical peak;
- the encoder per window at batch 1 and 4, and with torch.profiler the GFLOPS of its matrix products and of
  its attention;
- a model decoder pass over 1, 6 and 10 tokens, and one draft step of the `self:int8` copy, split by
  torch.profiler into attention, matrix products (int8 or fp32) and the rest.
The encoder output comes from noise: speed does not depend on what the audio says.
"""

from __future__ import annotations

import argparse

import torch
from benchlib import command_line, figure_path, timed, use_threads, write_figures
from torch.profiler import ProfilerActivity, profile

from asr.assist.assistants import low_precision_decoder
from asr.models.registry import load_model
from asr.whisper.decoder import WhisperDecoderAdapter
from asr.whisper.window import encode

MATMULS = ("aten::addmm", "aten::mm", "aten::_weight_int8pack_mm")
ATTENTION = "aten::_scaled_dot_product_flash_attention_for_cpu"


def timed_ms(fn, repeats: int = 30) -> float:
    """Milliseconds per call: three warm-ups, then `repeats` calls back to back."""
    return 1000 * timed(fn, repeats, warmup=3, mean=True)


def split_ms(fn, repeats: int = 10) -> dict[str, float]:
    """Milliseconds per call of `fn` in attention, matrix products and everything else (torch.profiler)."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(repeats):
            fn()
    self_us = {event.key: event.self_cpu_time_total for event in prof.key_averages()}
    total = sum(self_us.values())
    attention = self_us.get(ATTENTION, 0.0)
    matmul = sum(self_us.get(name, 0.0) for name in MATMULS)
    return {"attention": attention / repeats / 1000, "matmul": matmul / repeats / 1000,
            "rest": (total - attention - matmul) / repeats / 1000}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default=str(figure_path("steps")), help="writes OUT.json and OUT.md")
    args = parser.parse_args()
    use_threads(args.threads)
    data: dict[str, dict] = {"peak_gflops": {}, "encoder_s_per_window": {}, "encoder_window": {}, "passes": {}}
    rows: list[tuple[str, str]] = []  # (what, figure) for the Markdown table

    for dtype in (torch.float32, torch.bfloat16):
        a = torch.randn(2048, 2048, dtype=dtype)
        ms = timed_ms(lambda a=a: a @ a, 5)
        gflops = 2 * 2048 ** 3 / ms / 1e6
        print(f"2048^3 matrix product, {dtype}: {gflops:.0f} GFLOPS")
        data["peak_gflops"][str(dtype).removeprefix("torch.")] = gflops
        rows.append((f"2048^3 matrix product, {dtype}", f"{gflops:.0f} GFLOPS"))

    bundle = load_model("base")
    model, config = bundle.model, bundle.model.config
    features = torch.randn(4, bundle.n_mels, 3000)
    for batch in (1, 4):
        ms = timed_ms(lambda batch=batch: encode(model, features[:batch]), 3)
        print(f"encoder, batch {batch}: {ms / batch / 1000:.3f} s per window")
        data["encoder_s_per_window"][f"batch {batch}"] = ms / batch / 1000
        rows.append((f"encoder, batch {batch}", f"{ms / batch / 1000:.3f} s per window"))
    # FLOPs of one window: q, k, v, out and the MLP per frame and layer; scores and weighted values.
    d, frames, layers = config.d_model, config.max_source_positions, config.encoder_layers
    linear_gflop = 2 * frames * layers * (4 * d * d + 2 * d * config.encoder_ffn_dim) / 1e9
    attention_gflop = 2 * layers * 2 * frames * frames * d / 1e9
    split = split_ms(lambda: encode(model, features[:1]), 3)
    matmuls = (f"{linear_gflop:.1f} GFLOP in {split['matmul']:.0f} ms "
               f"({linear_gflop / split['matmul'] * 1000:.0f} GFLOPS)")
    attention = (f"{attention_gflop:.1f} GFLOP in {split['attention']:.0f} ms "
                 f"({attention_gflop / split['attention'] * 1000:.0f} GFLOPS)")
    print(f"encoder window: matrix products {matmuls}, attention {attention}, rest {split['rest']:.0f} ms")
    data["encoder_window"] = {"matmul_gflop": linear_gflop, "attention_gflop": attention_gflop,
                              **{f"{part}_ms": value for part, value in split.items()}}
    rows += [("encoder window, matrix products", matmuls), ("encoder window, attention", attention),
             ("encoder window, rest", f"{split['rest']:.0f} ms")]

    encoder_output = encode(model, features[:1])
    decoders = {"model": WhisperDecoderAdapter(model, encoder_output)}
    int8, int8_dtype = low_precision_decoder(model, "int8")
    decoders["self:int8"] = WhisperDecoderAdapter(int8.eval(), encoder_output.to(int8_dtype))
    for name, decoder in decoders.items():
        cache = decoder.new_cache(1)
        decoder.forward(torch.full((1, 60), 400), cache, 1)
        for width in ((1, 6, 10) if name == "model" else (1,)):
            ids = torch.full((1, width), 400)

            def step(decoder=decoder, cache=cache, ids=ids, width=width) -> None:
                decoder.crop(cache, 60)
                decoder.forward(ids, cache, width)

            ms = timed_ms(step)
            split = split_ms(step)
            parts = ", ".join(f"{part} {value:.1f}" for part, value in split.items())
            print(f"{name} decoder pass of {width} token(s): {ms:.1f} ms ({parts} ms)")
            data["passes"][f"{name} {width}"] = {"ms": ms, **{f"{part}_ms": value for part, value in split.items()}}
            rows.append((f"{name} decoder pass of {width} token(s)", f"{ms:.1f} ms ({parts} ms)"))

    table = "\n".join(["| measurement | figure |", "| --- | --- |",
                       *(f"| {what} | {figure} |" for what, figure in rows)])
    write_figures(args.out, data, table, command_line())


if __name__ == "__main__":
    main()
