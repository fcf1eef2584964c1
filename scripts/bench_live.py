"""Live transcription (`asr stream`): latency, compute per audio second, and the decoder's work per update, with
drafting from the last hypothesis and without, beside the offline transcript's WER.

    python scripts/bench_live.py                                   # -> docs/figures/live.{json,md}
    python scripts/bench_live.py --dtype int8 --runs realtime --out docs/figures/live-int8
    python scripts/bench_live.py --files p001.mp3 --out /tmp/live  # one file of longform/ ("sonnets": all three)

For each file: two streams at `--step` without `--realtime` (the same updates at the same audio positions: the
committed words must be equal, and the decoder's seconds compare), updated in turn, update by update, so that the
machine's load falls on both alike; then two with `--realtime` (audio arrives at
its own pace; latency from a word's end in the audio to its commit, wall clock). 2 threads, `base`. Decoder
seconds: the passes that make the tokens, drafting included (not the encoder, nor the word-alignment pass).
"Drafting" is what `asr stream` does by default: the last hypothesis, then the assistant `auto` picks (on a CPU
none: a draft chosen for files is left out of streams), or the one `--assistant` names (none: the hypothesis alone).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from benchlib import command_line, figure_path, longform_audio, use_threads, wer_percent, write_figures

FILES = ("sonnets", "voxpopuli-en-000.ogg")


def _streams(bundle, samples: np.ndarray, assistant, drafting: list[bool], step: float, realtime: bool,
             vad: bool) -> list[tuple[str, dict]]:
    """One stream per entry of `drafting`, fed the same chunks and updated in turn, update by update (stepped: a
    burst of load on the machine then slows both alike), or one real-time stream alone."""
    from asr.live import StreamingTranscriber
    from asr.live.sources import file_chunks
    from asr.live.voice import VoiceActivity
    from asr.options import TranscribeOptions

    assert not realtime or len(drafting) == 1, "a real-time stream runs alone"
    began = time.monotonic()
    clock = (lambda: time.monotonic() - began) if realtime else None
    streams = [StreamingTranscriber(bundle, TranscribeOptions(language="en"), assistant, drafting=on, clock=clock,
                                    voice=VoiceActivity() if vad else None) for on in drafting]
    for chunk in file_chunks(samples, step, realtime):
        for live in streams:
            live.insert_audio(chunk)
            live.process()
    found = []
    for live in streams:
        live.finish()
        stats = live.stats.to_dict()
        updates = max(stats["updates"], 1)
        stats["decoder_seconds_per_update"] = round(stats["decoder_seconds"] / updates, 4)
        stats["model_passes_per_update"] = round(stats["model_forward_passes"] / updates, 2)
        found.append(("".join(c.text for c in live.committed), stats))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", nargs="+", default=list(FILES), help="files of longform/")
    parser.add_argument("--step", type=float, default=1.0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--dtype", default="float32", choices=["float32", "int8"])
    parser.add_argument("--runs", default="stepped,realtime", help="stepped, realtime or both (comma-separated)")
    parser.add_argument("--vad", action="store_true", help="streams with voice activity detection (--vad)")
    parser.add_argument("--assistant", default="auto", help="what drafts after the last hypothesis "
                        "(`asr stream --assistant`; none: the hypothesis alone)")
    parser.add_argument("--out", default=str(figure_path("live")))
    args = parser.parse_args()
    use_threads(args.threads)

    from asr.assist.choose import make_assistant
    from asr.models.registry import load_model
    from asr.options import TranscribeOptions
    from asr.transcription import transcribe

    import torch

    precision = torch.float32 if args.dtype == "float32" else "int8"
    bundle = load_model("base", dtype=precision)
    assistant = make_assistant(args.assistant, bundle, dtype=precision)  # after the last hypothesis; None: that alone
    runs = [run == "realtime" for run in ("stepped", "realtime") if run in args.runs.split(",")]
    results = []
    for name in args.files:
        samples, reference = longform_audio(name)
        offline = transcribe(bundle, samples, TranscribeOptions(language="en")).text
        found = {"file": name, "seconds": round(len(samples) / 16000, 1),
                 "offline_wer": round(wer_percent(reference, offline), 2)}
        texts = {}
        for realtime in runs:
            labels = (("none", False), ("drafting", True))
            if realtime:
                streams = [_streams(bundle, samples, assistant, [on], args.step, True, args.vad)[0] for _, on in labels]
            else:
                streams = _streams(bundle, samples, assistant, [on for _, on in labels], args.step, False, args.vad)
            for (label, _), (text, stats) in zip(labels, streams):
                key = f"{'realtime' if realtime else 'stepped'}_{label}"
                texts[key] = text
                found[key] = {**stats, "wer": round(wer_percent(reference, text), 2)}
                print(name, key, {k: found[key][k] for k in ("wer", "compute_per_audio_second", "latency_mean",
                                                             "latency_p90", "decoder_seconds_per_update")}, flush=True)
        if "stepped_none" in texts:
            found["stepped_same_words"] = texts["stepped_none"] == texts["stepped_drafting"]
            found["stepped_decoder_ratio"] = round(found["stepped_none"]["decoder_seconds"]
                                                   / max(found["stepped_drafting"]["decoder_seconds"], 1e-9), 2)
        results.append(found)
    write_figures(args.out, {"files": results, "step": args.step, "threads": args.threads, "dtype": args.dtype,
                             "vad": args.vad, "assistant": args.assistant},
                  _table(results),
                  command_line())


def _table(results: list[dict]) -> str:
    lines = ["| file | run | WER % (offline) | compute / audio s | latency mean / p90 s | decoder s / update | "
             "model passes / update | acceptance |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for found in results:
        for key in ("stepped_none", "stepped_drafting", "realtime_none", "realtime_drafting"):
            if key not in found:
                continue
            s = found[key]
            run = key.replace("_", ", ") + (f" ({s['assistant']})" if key.endswith("drafting") else "")
            lines.append(f"| {found['file']} ({found['seconds']} s) | {run} | {s['wer']} "
                         f"({found['offline_wer']}) | {s['compute_per_audio_second']} | {s['latency_mean']} / "
                         f"{s['latency_p90']} | {s['decoder_seconds_per_update']} | {s['model_passes_per_update']} | "
                         f"{s['acceptance_rate']} |")
    lines.append("")
    for found in filter(lambda found: "stepped_same_words" in found, results):
        lines.append(f"- {found['file']}: stepped runs commit the same words with and without drafting: "
                     f"{found['stepped_same_words']}; decoder seconds {found['stepped_decoder_ratio']}x fewer.")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
