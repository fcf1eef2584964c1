"""How much batching the windows of different recordings can gain on this machine: the same recordings decoded
one at a time and together in one process, each run split into the decoder's seconds and everything else (mel,
encoder, cross-attention projections, language, word times), and the ceiling that the rest leaves.

    python scripts/bench_batch_ceiling.py                                  # -> docs/figures/batch-ceiling
    python scripts/bench_batch_ceiling.py --dtype int8 --out docs/figures/batch-ceiling-int8
    python scripts/bench_batch_ceiling.py --items eval --batch-size 8 --out docs/figures/batch-ceiling-eval
    python scripts/bench_batch_ceiling.py --device cuda --dtype float16 --out /tmp/batch-ceiling-gpu   # a GPU

`--items serve`: the 16 requests of `bench_serve.py` (English evaluation recordings of 10-30 s, client i sending
recording i modulo their number), `--batch-size 16`, the assistant `auto` picks (what `asr serve` runs);
`--items eval`: the English WER recordings of `bench_eval_batched.py`, plain greedy (its `greedy` configuration).
Rounds interleave the two modes. Batching can only make the decoder cheaper: the encoder runs one full 30 s
window per recording either way, compute-bound on a CPU (timed here alone in passes of 1 to 8 windows). A
decoder step still reads each row's own cross-attention keys and values (a window's encoder output, projected
once per layer), which no batch shares; at this machine's memory bandwidth (a 256 MB sum, 2 threads) that read
alone bounds the batched decoder from below. The ceilings: one-at-a-time wall over the time outside the decoder
(the cheaper mode's), with the decoder free and with it at that bound.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch
from benchlib import command_line, figure_path, machine, use_threads, wer_items, write_figures

FOLDERS = ("librispeech", "ljspeech", "clips", "spontaneous", "fleurs")


def _paths(items: str) -> list[str]:
    found = wer_items(FOLDERS, skip_missing=True)
    if items == "serve":
        found = [i for i in found if 10 <= i["duration_s"] <= 30]
    if not found:
        sys.exit("no English evaluation recordings found (set ASSISTED_WHISPER_EVALDATA)")
    return [found[i % len(found)]["audio"] for i in range(16)] if items == "serve" else [i["audio"] for i in found]


def _run(transcriber, paths: list[str], batch_size: int) -> dict:
    started = time.perf_counter()
    if batch_size == 1:
        results = [transcriber.transcribe_many([path], batch_size=1)[0] for path in paths]
    else:
        results = transcriber.transcribe_many(paths, batch_size=batch_size)
    wall = time.perf_counter() - started
    decoder = sum(r.stats.decode_seconds for r in results)
    return {"wall_seconds": round(wall, 3), "decoder_seconds": round(decoder, 3),
            "rest_seconds": round(wall - decoder, 3),
            "tokens": sum(r.stats.generation.generated_tokens for r in results),
            "model_passes": sum(r.stats.generation.model_forward_passes for r in results),
            "assistant": results[0].stats.assistant, "texts": [r.text.strip() for r in results]}


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _encoder_per_window(model, device: str, windows: int = 8) -> dict[str, float]:
    """Seconds a window in passes of 1, 2, 4 and 8 windows (the best of 2; a CPU's `CPU_ENCODER_ROWS` set to each,
    a GPU's passes made that size here)."""
    from asr.whisper import window as whisper_window

    features, rows_before = torch.randn(windows, 80, 3000), whisper_window.CPU_ENCODER_ROWS
    times: dict[int, list[float]] = {rows: [] for rows in (1, 2, 4, 8)}
    try:
        with torch.inference_mode():
            whisper_window.encode(model, features[:1])
            for _ in range(2):
                for rows in times:
                    whisper_window.CPU_ENCODER_ROWS = rows
                    _sync(device)
                    started = time.perf_counter()
                    for first in range(0, windows, rows):  # a GPU encodes a whole call at once
                        whisper_window.encode(model, features[first:first + rows])
                    _sync(device)
                    times[rows].append((time.perf_counter() - started) / windows)
    finally:
        whisper_window.CPU_ENCODER_ROWS = rows_before
    return {str(rows): round(min(values), 4) for rows, values in times.items()}


def _bandwidth(device: str) -> float:
    """Bytes per second that a sum over 256 MB on `device` reads (the best of 5)."""
    data, best = torch.ones(64 << 20, device=device), float("inf")
    for _ in range(5):
        _sync(device)
        started = time.perf_counter()
        data.sum()
        _sync(device)
        best = min(best, time.perf_counter() - started)
    return data.numel() * data.element_size() / best


def _cross_bytes(bundle) -> int:
    """The cross-attention keys and values one decoder row reads a step: every layer's, over the encoder's frames,
    at the precision they are kept in (the int8 model's bfloat16, else the model's)."""
    config = bundle.model.config
    itemsize = (getattr(bundle.model, "cross_attention_dtype", None) or bundle.model.dtype).itemsize
    return 2 * config.decoder_layers * config.max_source_positions * config.d_model * itemsize


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", choices=("serve", "eval"), default="serve")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--dtype", default="float32", help="`asr transcribe --dtype` (int8 on a CPU only)")
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default=str(figure_path("batch-ceiling")))
    args = parser.parse_args()
    use_threads(args.threads)
    from asr.assist.choose import load_pair
    from asr.models.precision import resolve_precision
    from asr.transcription import Transcriber, TranscribeOptions

    paths = _paths(args.items)
    found = machine()
    bundle, assistant = load_pair("base", "auto" if args.items == "serve" else "none", device=args.device,
                                  dtype=resolve_precision(args.dtype, args.device.split(":")[0]))
    options = TranscribeOptions(language="en") if args.items == "eval" else TranscribeOptions()
    transcriber = Transcriber(bundle, options, assistant=assistant)
    transcriber.transcribe_many(paths[:2], batch_size=2)  # warm up both paths' kernels
    rounds = []
    for number in range(args.rounds):
        one, many = _run(transcriber, paths, 1), _run(transcriber, paths, args.batch_size)
        rounds.append({"one_at_a_time": one, "batched": many, "same_text": sum(
            a == b for a, b in zip(one.pop("texts"), many.pop("texts")))})
        print(f"round {number + 1}: one at a time {one['wall_seconds']:.1f} s (decoder {one['decoder_seconds']:.1f}),"
              f" batched {many['wall_seconds']:.1f} s (decoder {many['decoder_seconds']:.1f})", flush=True)
    bandwidth = _bandwidth(args.device)
    data = {"items": args.items, "recordings": len(paths), "batch_size": args.batch_size, "dtype": args.dtype,
            "device": args.device, "rounds": rounds,
            "encoder_seconds_per_window": _encoder_per_window(bundle.model, args.device),
            "bandwidth_gb_s": round(bandwidth / 1e9, 1), "cross_mb_per_row_step": round(_cross_bytes(bundle) / 1e6, 1)}
    write_figures(args.out, data, _table(data), command_line(), found)
    print(_table(data))


def _median(rounds: list[dict], mode: str, key: str) -> float:
    return statistics.median(r[mode][key] for r in rounds)


def _table(data: dict) -> str:
    rounds, size = data["rounds"], data["batch_size"]
    modes = (("one at a time", "one_at_a_time"), (f"batches of {size}", "batched"))
    device = f", {data['device']}" if data.get("device", "cpu") != "cpu" else ""
    lines = [f"{data['recordings']} recordings (`--items {data['items']}`), `base` ({data['dtype']}{device}), "
             f"assistant `{rounds[0]['one_at_a_time']['assistant']}` alone, medians of {len(rounds)} interleaved "
             "rounds in one process:", "",
             "| | wall s | decoder s | the rest s | tokens | model passes |",
             "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for label, mode in modes:
        lines.append(f"| {label} | {_median(rounds, mode, 'wall_seconds'):.2f} | "
                     f"{_median(rounds, mode, 'decoder_seconds'):.2f} | {_median(rounds, mode, 'rest_seconds'):.2f} | "
                     f"{rounds[0][mode]['tokens']} | {rounds[0][mode]['model_passes']} |")
    serial, batched = _median(rounds, "one_at_a_time", "wall_seconds"), _median(rounds, "batched", "wall_seconds")
    # The most generous: whichever mode spent less outside the decoder.
    rest = min(_median(rounds, "batched", "rest_seconds"), _median(rounds, "one_at_a_time", "rest_seconds"))
    row_steps = rounds[0]["batched"]["tokens"]
    floor = row_steps * data["cross_mb_per_row_step"] * 1e6 / (data["bandwidth_gb_s"] * 1e9)
    encoder = data["encoder_seconds_per_window"]
    lines += ["", f"Batched {serial / batched:.2f}x one at a time (the same text on "
              f"{min(r['same_text'] for r in rounds)} of {data['recordings']}). The encoder alone, seconds a window in "
              f"passes of 1, 2, 4 and 8 windows: {', '.join(f'{encoder[k]:.3f}' for k in ('1', '2', '4', '8'))}. "
              f"Each decoder row reads {data['cross_mb_per_row_step']:.1f} MB of cross-attention keys and values a "
              f"step; {row_steps} row steps at {data['bandwidth_gb_s']:.0f} GB/s take at least {floor:.2f} s. "
              f"Ceiling, the rest as the cheaper mode's: {serial / rest:.2f}x with a free decoder, "
              f"{serial / (rest + floor):.2f}x with the decoder at that bound."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
