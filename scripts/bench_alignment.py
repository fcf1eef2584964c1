"""The word-timestamp pass (asr/whisper/alignment.py): through the decoder adapter, over the cross-attention keys and
values decoding projected, against transformers' eager decoder over the encoder output (the pass it replaced).

    python scripts/bench_alignment.py [--threads 2] [--dtypes float32,int8] [--out docs/figures/alignment]

For each precision: `transcribe` the first 28 s of the sonnets with word timestamps, then time both passes over
that window's final tokens (start sequence, text, end of text), interleaved, median of `--repeats`; the adapter's
side includes projecting the cross-attention keys and values once (`WhisperDecoderAdapter`), as a window that
is not decoded would need. Also: the largest differences between the two passes' logits and attention weights,
and the two loops after the pass over arrays of that window's shape (its text tokens and end of text over the 28 s
of frames, the model's alignment heads): the median filter and the dynamic time warping, transformers' against the
compiled ones (`asr.whisper.alignment_kernels`), and whether they give the same results.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch
from benchlib import command_line, figure_path, sonnets, use_threads, write_figures

from asr.models.registry import load_model
from asr.options import TranscribeOptions
from asr.transcription import Transcriber
from asr.whisper import alignment_kernels
from asr.whisper.alignment import transformers_alignment_pass
from asr.whisper.alignment_kernels import dynamic_time_warping, median_filter
from asr.whisper.decoder import WhisperDecoderAdapter
from asr.whisper.window import encode
from audio.features import log_mel


def measure(dtype: str, repeats: int) -> dict:
    bundle = load_model("base", dtype=dtype)
    samples = sonnets()[:16000 * 28]
    result = Transcriber(bundle, TranscribeOptions(language="en", word_timestamps=True)).segments(samples).result()
    special = bundle.special
    text = [t for s in result.segments for t in s.tokens if t < special.eot]
    ids = torch.tensor([special.prompt([], "en", "transcribe", False)[0] + text + [special.eot]])
    encoder_output = encode(bundle.model, log_mel([samples], bundle.n_mels))
    heads = bundle.alignment_heads
    adapter = WhisperDecoderAdapter(bundle.model, encoder_output)
    passes = {
        "eager decoder": lambda: transformers_alignment_pass(bundle.model, ids, encoder_output, heads),
        "adapter, keys and values reused": lambda: adapter.alignment_pass(ids, heads),
        "adapter, keys and values projected": lambda: WhisperDecoderAdapter(bundle.model, encoder_output)
        .alignment_pass(ids, heads),
    }
    times: dict[str, list[float]] = {name: [] for name in passes}
    for _ in range(repeats + 1):  # the first round warms up
        for name, run in passes.items():
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
    (old_logits, old_weights), (new_logits, new_weights) = passes["eager decoder"](), adapter.alignment_pass(ids, heads)
    return {"dtype": dtype, "tokens": ids.shape[1],
            "ms": {name: round(1000 * statistics.median(t[1:]), 1) for name, t in times.items()},
            "loops": _loops(len(heads), len(text) + 1, len(samples) // 320, repeats),
            "logits_max_difference": float((old_logits - new_logits).abs().max()),
            "weights_max_difference": float((old_weights - new_weights).abs().max())}


def _loops(heads: int, tokens: int, frames: int, repeats: int) -> dict:
    """transformers' and the compiled median filter (over `[heads, tokens, frames]`) and time warping (over
    `[tokens, frames]`): ms each (medians of `repeats`), and whether the two give the same results."""
    from transformers.models.whisper.generation_whisper import _dynamic_time_warping, _median_filter

    weights = np.random.default_rng(0).normal(size=(heads, tokens, frames)).astype(np.float32)
    kernels = {"median filter": (lambda: _median_filter(torch.from_numpy(weights), 7).numpy(),
                                 lambda: median_filter(weights, 7)),
               "time warping": (lambda: _dynamic_time_warping(weights[0].astype(np.float64)),
                                lambda: dynamic_time_warping(weights[0].astype(np.float64)))}
    alignment_kernels.load()  # compiled (or loaded from numba's cache) before timing, for every window's shape
    found = {"shape": [heads, tokens, frames]}
    for name, (theirs, ours) in kernels.items():
        times = {"transformers": [], "compiled": []}
        for _ in range(repeats):
            for side, run in (("transformers", theirs), ("compiled", ours)):
                start = time.perf_counter()
                run()
                times[side].append(time.perf_counter() - start)
        expected, got = theirs(), ours()
        same = all(map(np.array_equal, expected, got)) if isinstance(got, tuple) else np.array_equal(expected, got)
        found[name] = {side: round(1000 * statistics.median(t), 3) for side, t in times.items()} | {"same": same}
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--dtypes", default="float32,int8")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--out", default=str(figure_path("alignment")))
    args = parser.parse_args()
    use_threads(args.threads)
    rows = [measure(dtype, args.repeats) for dtype in args.dtypes.split(",")]
    names = list(rows[0]["ms"])
    table = "\n".join([
        "| dtype | tokens | " + " | ".join(f"{n} ms" for n in names) + " | logits max diff | weights max diff |",
        "| --- | ---: | " + " | ".join("---:" for _ in names) + " | ---: | ---: |",
        *(f"| {r['dtype']} | {r['tokens']} | " + " | ".join(str(r["ms"][n]) for n in names)
          + f" | {r['logits_max_difference']:.3g} | {r['weights_max_difference']:.3g} |" for r in rows)])
    loops = rows[0]["loops"]
    heads, tokens, frames = loops["shape"]
    table += (f"\n\nThe loops after the pass, over that window's shape ({heads} heads, {tokens} tokens, {frames} frames), "
              "ms, transformers' against compiled (`asr.whisper.alignment_kernels`):\n\n"
              "| loop | transformers ms | compiled ms | the same result |\n| --- | ---: | ---: | --- |\n"
              + "\n".join(f"| {name} | {loops[name]['transformers']} | {loops[name]['compiled']} | {loops[name]['same']} |"
                          for name in ("median filter", "time warping")))
    print(table)
    write_figures(args.out, {"rows": rows}, table, command_line())


if __name__ == "__main__":
    main()
