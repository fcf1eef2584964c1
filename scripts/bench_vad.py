"""Long files: sequential greedy against `--vad` and `--batch-size`, and faster-whisper's batched pipeline.

    python scripts/bench_vad.py [--repeats 1] [--threads 2] [--batch-size 8] [--out docs/figures/vad]

Recordings (English, with references, from ../shared/evaldata/longform): the three sonnets joined (158 s), the
VoxPopuli speech (69 s), and a ~10-minute file made of those pieces one after another with pauses of 2-8 s
between them, repeated. Model `base`, fp32 on the CPU, language given (en), greedy with temperature fallback.
Per recording and repeat the configurations run one after the other in a rotating order (interleaved), after
a warm-up of each on the first 30 s; the table gives medians over repeats, WER with the project's normaliser,
and the speed-up against sequential greedy on the same recording. Silero VAD's own cost is measured apart for
its three backends on the same audio.

Writes docs/figures/vad.json and docs/figures/vad.md (all three tables; `--out` to change; `--render` rewrites
the .md file from OUT.json), after each recording, so a run killed midway keeps what it finished.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time

import numpy as np
from benchlib import (
    SAMPLE_RATE,
    SONNETS,
    VOXPOPULI,
    command_line,
    figure_path,
    load,
    longform_rows,
    rewrite_markdown,
    use_threads,
    write_figures,
)
from eval.backends.ctranslate2 import INSTALL_HINT


def recordings() -> dict[str, tuple[np.ndarray, str]]:
    """name -> (samples, reference)."""
    rows = longform_rows()
    pieces = [(load(f"longform/{name}"), rows[name]["text_body"]) for name in SONNETS]
    vox = (load(f"longform/{VOXPOPULI}"), rows[VOXPOPULI]["text"])
    sonnets = (np.concatenate([p[0] for p in pieces]), " ".join(p[1] for p in pieces))
    # ~10 minutes: every piece in turn with a pause of 2, 4, 6 or 8 s after it (silence and light noise, as
    # between the takes of a recording), until 600 s.
    rng = np.random.default_rng(0)
    parts, texts, length, turn = [], [], 0, 0
    while length < 600 * SAMPLE_RATE:
        samples, text = (pieces + [vox])[turn % 4]
        pause = (rng.normal(0, 0.002, (2 + 2 * (turn % 4)) * SAMPLE_RATE)).astype(np.float32)
        parts += [samples, pause]
        texts.append(text)
        length += len(samples) + len(pause)
        turn += 1
    ten = (np.concatenate(parts), " ".join(texts))
    return {"sonnets": sonnets, "voxpopuli": vox, "ten-minutes": ten}


class Ours:
    def __init__(self, name: str, bundle, options, assistant=None) -> None:
        self.name, self.bundle, self.options, self.assistant = name, bundle, options, assistant

    def run(self, samples: np.ndarray) -> dict:
        from asr.transcription import transcribe

        result = transcribe(self.bundle, samples, self.options, self.assistant)
        lengths = [s.end - s.start for s in result.segments]
        return {"text": result.text, "segments": len(result.segments), "windows": result.stats.windows,
                "tokens": result.stats.generation.generated_tokens, "vad_seconds": result.stats.vad_seconds,
                "max_segment_s": max(lengths, default=0.0),
                "median_segment_s": statistics.median(lengths) if lengths else 0.0}


class FasterWhisperBatched:
    def __init__(self, name: str, compute_type: str, batch_size: int, threads: int) -> None:
        from faster_whisper import BatchedInferencePipeline, WhisperModel

        from eval.backends.ctranslate2 import ct2_folder

        self.name, self.batch_size = name, batch_size
        model = WhisperModel(str(ct2_folder("base")), device="cpu", compute_type=compute_type, cpu_threads=threads,
                             local_files_only=True)
        self.pipeline = BatchedInferencePipeline(model)

    def run(self, samples: np.ndarray) -> dict:
        # Greedy (beam 1) like ours; otherwise its defaults (no timestamp tokens, its VAD settings).
        segments, _ = self.pipeline.transcribe(samples, language="en", batch_size=self.batch_size, beam_size=1)
        segments = list(segments)
        lengths = [s.end - s.start for s in segments]
        return {"text": "".join(s.text for s in segments), "segments": len(segments), "windows": None,
                "tokens": sum(len(s.tokens) for s in segments), "vad_seconds": None,
                "max_segment_s": max(lengths, default=0.0),
                "median_segment_s": statistics.median(lengths) if lengths else 0.0}


# Silero VAD's probability models: the library's (`audio.vad`, the "sequence" ONNX model), and the two streaming
# models measured beside it, frame-by-frame ONNX and TorchScript.
BACKENDS = ("onnx-sequence", "onnx", "jit")


@functools.lru_cache(maxsize=None)
def streaming_model(backend: str):
    from audio.vad import silero

    return silero().load_silero_vad(onnx=backend == "onnx", sequence=False)


def vad_regions(samples: np.ndarray, options, backend: str) -> list:
    """`audio.vad.speech_regions` with the probabilities of `backend`'s model."""
    import torch

    from audio.vad import regions_of, speech_regions

    if backend == "onnx-sequence" or not len(samples):
        return speech_regions(samples, options)
    with torch.inference_mode():
        probabilities = streaming_model(backend).audio_forward(torch.from_numpy(samples.astype(np.float32)),
                                                               SAMPLE_RATE).reshape(-1)
    return regions_of(probabilities.numpy(), len(samples), options)


def vad_costs(audios: dict[str, tuple[np.ndarray, str]]) -> list[dict]:
    """Seconds of Silero VAD per backend on the first two recordings (after a call that loads each model); every
    backend must find the same regions."""
    from asr.options import BATCHED_VAD

    rows = []
    for backend in BACKENDS:
        vad_regions(audios["voxpopuli"][0][: 5 * SAMPLE_RATE], BATCHED_VAD, backend)
    for name, (samples, _) in list(audios.items())[:2]:
        found = {}
        for backend in BACKENDS:
            start = time.perf_counter()
            found[backend] = vad_regions(samples, BATCHED_VAD, backend)
            seconds = time.perf_counter() - start
            rows.append({"recording": name, "backend": backend, "seconds": seconds,
                         "rtf": seconds / (len(samples) / SAMPLE_RATE), "regions": len(found[backend])})
            print(f"VAD {backend} on {name}: {seconds:.2f} s", file=sys.stderr)
        if any(regions != found["onnx-sequence"] for regions in found.values()):
            raise SystemExit(f"Silero's models found different speech regions on {name}")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--only", default=None, help="comma-separated recordings (default: all three)")
    parser.add_argument("--configs", default=None, help="comma-separated configuration names (default: all)")
    parser.add_argument("--out", default=str(figure_path("vad")), help="writes OUT.json and OUT.md")
    parser.add_argument("--render", action="store_true", help="only rewrite OUT.md from OUT.json")
    args = parser.parse_args()
    if args.render:
        rewrite_markdown(args.out, render)
        return


    from asr.models.registry import load_model
    from asr.options import TranscribeOptions
    from audio.vad import VadOptions
    from eval.wer import error_counts

    use_threads(args.threads)
    audios = recordings()
    if args.only:
        audios = {name: audios[name] for name in args.only.split(",")}
    bundle = load_model("base")
    n = args.batch_size
    greedy = TranscribeOptions(language="en")
    configs = [
        Ours("greedy (sequential)", bundle, greedy),
        Ours("greedy --vad", bundle, TranscribeOptions(language="en", vad=VadOptions())),
        Ours(f"--batch-size {n}", bundle, TranscribeOptions(language="en", batch_size=n)),
        Ours(f"--batch-size {n} --word-timestamps", bundle,
             TranscribeOptions(language="en", batch_size=n, word_timestamps=True)),
        Ours(f"--batch-size {n} --timestamps", bundle, TranscribeOptions(language="en", batch_size=n, timestamps=True)),
    ]
    try:
        configs += [FasterWhisperBatched(f"faster-whisper batched {n} fp32", "float32", n, args.threads),
                    FasterWhisperBatched(f"faster-whisper batched {n} int8", "int8", n, args.threads)]
    except ImportError:
        print(f"faster-whisper is not installed ({INSTALL_HINT}): its rows are left out", file=sys.stderr)
    if args.configs:
        wanted = args.configs.split(",")
        configs = [c for c in configs if c.name in wanted]
    vad_rows = vad_costs(audios)
    warm = next(iter(audios.values()))[0][: 30 * SAMPLE_RATE]
    for config in configs:
        config.run(warm)
    runs: list[dict] = []
    for repeat in range(args.repeats):
        for position, (name, (samples, reference)) in enumerate(audios.items()):
            start = (repeat + position) % len(configs)
            for config in configs[start:] + configs[:start]:
                begin = time.perf_counter()
                out = config.run(samples)
                seconds = time.perf_counter() - begin
                out.update(config=config.name, recording=name, repeat=repeat, seconds=seconds,
                           audio_seconds=len(samples) / SAMPLE_RATE,
                           wer=error_counts([reference], [out["text"]]).rate)
                runs.append(out)
                print(f"{name} {config.name}: {seconds:.1f} s, WER {100 * out['wer']:.2f} %", file=sys.stderr)
            # After each recording, so that a long run killed midway leaves the recordings it finished.
            done = list(audios)[: position + 1] if repeat == 0 else list(audios)
            write(args, runs, vad_rows, [c.name for c in configs], {k: audios[k] for k in done})


def summary(runs: list[dict], names: list[str], recordings: list[str]) -> list[dict]:
    rows = []
    for recording in recordings:
        base = statistics.median(r["seconds"] for r in runs if r["recording"] == recording and r["config"] == names[0])
        for name in names:
            mine = [r for r in runs if r["recording"] == recording and r["config"] == name]
            seconds = statistics.median(r["seconds"] for r in mine)
            first = mine[0]
            rows.append({"recording": recording, "config": name, "seconds": seconds,
                         "rtf": seconds / first["audio_seconds"], "speedup": base / seconds, "wer": first["wer"],
                         "segments": first["segments"], "median_segment_s": first["median_segment_s"],
                         "max_segment_s": first["max_segment_s"], "tokens": first["tokens"],
                         "windows": first["windows"], "audio_seconds": first["audio_seconds"]})
    return rows


def write(args, runs: list[dict], vad_rows: list[dict], names: list[str], audios: dict) -> None:
    data = {"repeats": args.repeats, "summary": summary(runs, names, list(audios)),
            "runs": [{k: v for k, v in r.items() if k != "text"} for r in runs], "vad": vad_rows}
    table = render(data)
    write_figures(args.out, data, table, command_line())
    print(table, file=sys.stderr)


def render(data: dict) -> str:
    """The Markdown tables of a run's JSON: everything, then the short summary that the README quotes."""
    rows = data["summary"]
    lines = [f"Medians of {data['repeats']} interleaved repeat(s). Model `base`, fp32 unless named, language en.", "",
             ("| recording | configuration | s | RTF | speed-up vs sequential | WER | segments "
              "| median / max segment s | tokens | windows |"),
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        lines.append(f"| {r['recording']} ({r['audio_seconds']:.0f} s) | {r['config']} | {r['seconds']:.2f} | "
                     f"{r['rtf']:.4f} | {r['speedup']:.2f}x | {100 * r['wer']:.2f} % | {r['segments']} | "
                     f"{r['median_segment_s']:.1f} / {r['max_segment_s']:.1f} | {r['tokens']} | "
                     f"{'-' if r['windows'] is None else r['windows']} |")
    lines += ["", summary_table(data).rstrip("\n"), "", "Silero VAD alone (the batched mode's rules), seconds and RTF:", "",
              "| recording | backend | s | RTF | regions |", "| --- | --- | ---: | ---: | ---: |"]
    for r in data["vad"]:
        lines.append(f"| {r['recording']} | {r['backend']} | {r['seconds']:.3f} | {r['rtf']:.4f} | {r['regions']} |")
    return "\n".join(lines) + "\n"


def summary_table(data: dict) -> str:
    """The short summary table (the first of OUT.md's tables)."""
    rows = data["summary"]
    recordings = list(dict.fromkeys(r["recording"] for r in rows))
    lines = ["Summary: speed-up against sequential greedy on the same recording (WER in brackets).", "",
             "| configuration | " + " | ".join(recordings) + " |",
             "| --- |" + " ---: |" * len(recordings)]
    for name in dict.fromkeys(r["config"] for r in rows):
        cells = [next(f"{r['speedup']:.2f}x ({100 * r['wer']:.1f} %)" for r in rows
                      if r["config"] == name and r["recording"] == recording) for recording in recordings]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
