"""Where a CPU's time goes for `base`: the fp32 peak, the encoder, model passes and an int8 draft step.

    python scripts/bench_steps.py [--threads 2]

Prints (the README's figures under "Batch transcription" and "What `auto` picks"):
- the fp32 and bf16 throughput of a 2048^3 matrix product, the machine's practical peak;
- the encoder per window at batch 1 and 4, and with torch.profiler the GFLOPS of its matrix products and of
  its attention;
- a model decoder pass over 1, 6 and 10 tokens, and one draft step of the `self:int8` copy, split by
  torch.profiler into attention, matrix products (int8 or fp32) and the rest.
The encoder output comes from noise: speed does not depend on what the audio says.
"""

from __future__ import annotations

import argparse
import time

import torch
from torch.profiler import ProfilerActivity, profile

from asr.assist.assistants import low_precision_decoder
from asr.decoder import WhisperDecoderAdapter
from asr.window import encode
from asr.models.registry import load_model

MATMULS = ("aten::addmm", "aten::mm", "aten::_weight_int8pack_mm")
ATTENTION = "aten::_scaled_dot_product_flash_attention_for_cpu"


def timed_ms(fn, repeats: int = 30) -> float:
    for _ in range(3):
        fn()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - start) / repeats * 1000


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
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    for dtype in (torch.float32, torch.bfloat16):
        a = torch.randn(2048, 2048, dtype=dtype)
        ms = timed_ms(lambda: a @ a, 5)
        print(f"2048^3 matrix product, {dtype}: {2 * 2048 ** 3 / ms / 1e6:.0f} GFLOPS")

    bundle = load_model("base")
    model, config = bundle.model, bundle.model.config
    features = torch.randn(4, bundle.n_mels, 3000)
    for batch in (1, 4):
        ms = timed_ms(lambda: encode(model, features[:batch]), 3)
        print(f"encoder, batch {batch}: {ms / batch / 1000:.3f} s per window")
    # FLOPs of one window: q, k, v, out and the MLP per frame and layer; scores and weighted values.
    d, frames, layers = config.d_model, config.max_source_positions, config.encoder_layers
    linear_gflop = 2 * frames * layers * (4 * d * d + 2 * d * config.encoder_ffn_dim) / 1e9
    attention_gflop = 2 * layers * 2 * frames * frames * d / 1e9
    split = split_ms(lambda: encode(model, features[:1]), 3)
    print(f"encoder window: matrix products {linear_gflop:.1f} GFLOP in {split['matmul']:.0f} ms "
          f"({linear_gflop / split['matmul'] * 1000:.0f} GFLOPS), attention {attention_gflop:.1f} GFLOP in "
          f"{split['attention']:.0f} ms ({attention_gflop / split['attention'] * 1000:.0f} GFLOPS), "
          f"rest {split['rest']:.0f} ms")

    encoder_output = encode(model, features[:1])
    decoders = {"model": WhisperDecoderAdapter(model, encoder_output)}
    int8, int8_dtype = low_precision_decoder(model, "int8")
    decoders["self:int8"] = WhisperDecoderAdapter(int8.eval(), encoder_output.to(int8_dtype))
    for name, decoder in decoders.items():
        cache = decoder.new_cache(1)
        decoder.forward(torch.full((1, 60), 400), cache, 1)
        for width in ((1, 6, 10) if name == "model" else (1,)):
            ids = torch.full((1, width), 400)

            def step() -> None:
                decoder.crop(cache, 60)
                decoder.forward(ids, cache, width)

            ms = timed_ms(step)
            parts = ", ".join(f"{part} {value:.1f}" for part, value in split_ms(step).items())
            print(f"{name} decoder pass of {width} token(s): {ms:.1f} ms ({parts} ms)")


if __name__ == "__main__":
    main()
