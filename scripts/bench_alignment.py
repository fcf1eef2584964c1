"""The word-timestamp pass (asr/whisper/alignment.py): through the decoder adapter, over the cross-attention keys and
values decoding projected, against transformers' eager decoder over the encoder output (the pass it replaced).

    python scripts/bench_alignment.py [--threads 2] [--dtypes float32,int8] [--out docs/figures/alignment]

For each precision: `transcribe` the first 28 s of the sonnets with word timestamps, then time both passes over
that window's final tokens (start sequence, text, end of text), interleaved, median of `--repeats`; the adapter's
side includes projecting the cross-attention keys and values once (`WhisperDecoderAdapter`), as a window that
is not decoded would need. Also: the largest differences between the two passes' logits and attention weights,
and the dynamic time warping of a cost matrix of that window's shape (its text tokens and end of text over the
28 s of frames): transformers' Python loop against the compiled one (`asr.whisper.dtw`), and whether their paths
are the same.
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
from asr.whisper.alignment import transformers_alignment_pass
from asr.whisper.decoder import WhisperDecoderAdapter
from asr.whisper.dtw import dynamic_time_warping
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
            "time_warping": _time_warping(len(text) + 1, len(samples) // 320, repeats),
            "logits_max_difference": float((old_logits - new_logits).abs().max()),
            "weights_max_difference": float((old_weights - new_weights).abs().max())}


def _time_warping(tokens: int, frames: int, repeats: int) -> dict:
    """transformers' and the compiled time warping over one `[tokens, frames]` cost matrix: ms each, same path."""
    from transformers.models.whisper.generation_whisper import _dynamic_time_warping

    matrix = np.random.default_rng(0).normal(size=(tokens, frames))
    dynamic_time_warping(matrix)  # compiled (or loaded from numba's cache) before timing
    found = {}
    for name, warp in (("transformers", _dynamic_time_warping), ("compiled", dynamic_time_warping)):
        found[name] = []
        for _ in range(repeats):
            start = time.perf_counter()
            path = warp(matrix)
            found[name].append(time.perf_counter() - start)
        found[name + "_path"] = [p.tolist() for p in path]
    return {"shape": [tokens, frames], "transformers_ms": round(1000 * statistics.median(found["transformers"]), 2),
            "compiled_ms": round(1000 * statistics.median(found["compiled"]), 3),
            "same_path": found["transformers_path"] == found["compiled_path"]}


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
    warping = rows[0]["time_warping"]
    table += ("\n\nDynamic time warping over a cost matrix of that window's shape "
              f"({warping['shape'][0]} tokens x {warping['shape'][1]} frames): transformers' loop "
              f"{warping['transformers_ms']} ms, compiled (`asr.whisper.dtw`) {warping['compiled_ms']} ms; the same "
              f"path: {warping['same_path']}.")
    print(table)
    write_figures(args.out, {"rows": rows}, table, command_line())


if __name__ == "__main__":
    main()
