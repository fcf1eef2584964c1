"""What a decoder step's packed weights save (`decoding.kernels.native.pack`, `packed_products` in csrc/rowdot.c)
against its products over the weights as stored, for `base` in float32 and int8, by pass width.

    python scripts/bench_packed.py [--threads 2] [--repeats 9] [--widths 1,4,8,17,24] [--out docs/figures/packed]

Each configuration is the same native step (`decoding.kernels.native_step`), built once with its layers' weights
packed and once without (`PACK_LIMIT` 0), over the first 30 s of the second sonnet at position ~45: a one-token
step, checks of `width - 1` drafts, and a batch of 8 windows' one-token step (`rows_step`, one row a window), the
head screened as in decoding. Milliseconds a pass, medians over `--repeats` interleaved rounds of 20 passes.
Writes OUT.json and OUT.md.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from benchlib import EVALDATA, command_line, figure_path, machine, use_threads, write_figures

from asr.models.precision import INT8
from asr.models.registry import load_model
from asr.whisper.decoder import WhisperDecoderAdapter
from asr.whisper.window import encode
from audio.load import load_audio
from decoding.kernels import native, native_step

PROMPT = [50258, 50259, 50359, 50363] + list(range(400, 440))
BATCH = 8


def decoders(dtype: str, features: torch.Tensor, exact: list[int]) -> dict:
    """The model's decoder over one window and over BATCH copies of it, packed and not (each step built now)."""
    model = load_model("base", dtype=INT8 if dtype == "int8" else None).model
    encoder_output = encode(model, features)
    built = {}
    limit = native_step.PACK_LIMIT
    for packed in (True, False):
        native_step.PACK_LIMIT = limit if packed else 0
        try:
            one = WhisperDecoderAdapter(model, encoder_output).screened(exact)
            batch = WhisperDecoderAdapter(model, encoder_output.expand(BATCH, -1, -1).contiguous()).screened(exact)
            for decoder in (one, batch):
                decoder.forward(torch.tensor([PROMPT] * decoder.batch_size), decoder.new_cache(decoder.batch_size), 1)
                decoder.forward(torch.full((decoder.batch_size, 1), 500), decoder.new_cache(decoder.batch_size), 1)
                assert decoder._step() is not None
        finally:
            native_step.PACK_LIMIT = limit
        built[packed] = (one, batch)
    return built


def pass_ms(decoder, rows: int, passes: int = 20) -> float:
    batch = decoder.batch_size
    passes = min(passes, (448 - len(PROMPT)) // rows)  # within the decoder's 448 positions
    cache = decoder.new_cache(decoder.batch_size)
    decoder.forward(torch.tensor([PROMPT] * batch), cache, 1)
    start = time.perf_counter()
    for i in range(passes):
        decoder.forward(torch.full((batch, rows), 500 + i), cache, rows)
    return (time.perf_counter() - start) / passes * 1e3


def measure(dtype: str, widths: list[int], repeats: int, features: torch.Tensor, exact: list[int]) -> list:
    built = decoders(dtype, features, exact)
    cases = [(f"{'one token' if w == 1 else f'check of {w - 1} drafts'}", 0, w) for w in widths]
    cases.append((f"{BATCH} windows, one token each", 1, 1))
    times = {(name, packed): [] for name, _, _ in cases for packed in built}
    for _ in range(repeats):
        for name, which, rows in cases:
            for packed, pair in built.items():
                times[(name, packed)].append(pass_ms(pair[which], rows))
    found = []
    for name, _, rows in cases:
        packed_ms, stored_ms = (statistics.median(times[(name, p)]) for p in (True, False))
        found.append({"dtype": dtype, "pass": name, "rows": rows, "stored_ms": round(stored_ms, 2),
                      "packed_ms": round(packed_ms, 2), "speedup": round(stored_ms / packed_ms, 2)})
        print(found[-1], flush=True)
    return found


def table(rows: list[dict]) -> str:
    lines = ["| base | pass | weights as stored, ms | packed, ms | speed-up |", "| --- | --- | ---: | ---: | ---: |"]
    for row in rows:
        lines.append(f"| {row['dtype']} | {row['pass']} | {row['stored_ms']:.2f} | {row['packed_ms']:.2f} | "
                     f"{row['speedup']:.2f}x |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--widths", default="1,4,8,17,24", help="tokens a pass feeds (comma-separated)")
    parser.add_argument("--dtypes", default="float32,int8")
    parser.add_argument("--out", default=str(figure_path("packed")), help="writes OUT.json and OUT.md")
    args = parser.parse_args()
    use_threads(args.threads)
    if native.library() is None:
        raise SystemExit("decoding.kernels.native could not be built here (no C compiler?)")
    bundle = load_model("base")
    samples = load_audio(str(EVALDATA / "longform" / "p002.mp3"))[:30 * 16000]
    features = bundle.feature_extractor(samples, sampling_rate=16000, return_tensors="pt").input_features
    exact = list(range(bundle.special.eot, bundle.model.config.vocab_size))
    widths = [int(w) for w in args.widths.split(",")]
    rows = [row for dtype in args.dtypes.split(",") for row in measure(dtype, widths, args.repeats, features, exact)]
    write_figures(args.out, {"passes": rows}, table(rows), command_line("bench_packed.py"), machine())


if __name__ == "__main__":
    main()
