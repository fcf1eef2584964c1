"""Memory over a long file: resident memory after every window of one transcription (issue 4: flat over 2 hours).

    python scripts/bench_memory.py [--minutes 120] [--assistant none] [--threads 2] [--keep FILE] [--batch-size N]
        [--out docs/figures/memory]

The long file is the long-form recordings of ../shared/evaldata (the sonnets, the VoxPopuli speech) repeated
with a second of silence between them up to the length asked, written as FLAC and transcribed from the file
like any user's. Prints the resident set size (RSS, from /proc) before loading the audio, after the first
window, at each tenth of the file and at the end, and the growth from the tenth window to the end; writes
them to docs/figures/memory.json and docs/figures/memory.md (`--out` to change).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import numpy as np
from benchlib import (
    SAMPLE_RATE,
    SONNETS,
    VOXPOPULI,
    command_line,
    figure_path,
    load,
    use_threads,
    write_figures,
)


def rss_mb() -> float:
    """This process's resident set size in MB (Linux)."""
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def long_recording(seconds: float) -> np.ndarray:
    """The long-form recordings one after another, a second of silence apart, repeated to `seconds`."""
    pieces = [load(f"longform/{name}") for name in (*SONNETS, VOXPOPULI)]
    gap = np.zeros(SAMPLE_RATE, dtype=np.float32)
    cycle = np.concatenate([part for piece in pieces for part in (piece, gap)])
    repeats = int(np.ceil(seconds * SAMPLE_RATE / len(cycle)))
    return np.tile(cycle, repeats)[: int(seconds * SAMPLE_RATE)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=120.0)
    parser.add_argument("--assistant", default="none")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--keep", help="write the long file here (and reuse it if it exists) instead of a temp file")
    parser.add_argument("--batch-size", type=int, default=None,
                        help="the batched mode (speech chunks, N at a time); RSS is then read after each batch")
    parser.add_argument("--out", default=str(figure_path("memory")), help="writes OUT.json and OUT.md")
    args = parser.parse_args()

    import soundfile as sf

    from asr.assist.choose import make_assistant
    from asr.transcription import transcribe
    from asr.models.registry import load_model
    from asr.options import TranscribeOptions

    use_threads(args.threads)
    path = Path(args.keep) if args.keep else Path(tempfile.mkdtemp()) / "long.flac"
    if not path.exists():
        sf.write(path, long_recording(args.minutes * 60), SAMPLE_RATE)
    bundle = load_model("base")
    assistant = make_assistant(args.assistant, bundle)
    samples: list[tuple[float, float, float]] = []  # (audio seconds done, wall seconds, RSS MB)
    start = time.perf_counter()
    before = rss_mb()

    def progress(done: float, total: float) -> None:
        samples.append((done, time.perf_counter() - start, rss_mb()))

    options = TranscribeOptions(batch_size=args.batch_size)
    result = transcribe(bundle, str(path), options, assistant=assistant, progress=progress)
    total = result.stats.audio_seconds
    tokens = result.stats.generation.generated_tokens
    unit = "batches" if args.batch_size else "windows"
    wall_total = time.perf_counter() - start
    lines = [(f"{total / 60:.1f} min of audio, {len(samples)} {unit}, {wall_total:.0f} s, "
              f"RTF {result.stats.rtf:.3f}, {len(result.segments)} segments, {tokens} tokens"),
             (f"RSS before the audio was read: {before:.0f} MB (model loaded; the 16 kHz float32 samples add "
              f"{total * SAMPLE_RATE * 4 / 2**20:.0f} MB)"),
             "| audio done | window | wall s | RSS MB |\n| ---: | ---: | ---: | ---: |"]
    marks = sorted({0, 9} | {min(len(samples) - 1, round(len(samples) * f / 10)) for f in range(1, 11)})
    for index in marks:
        done, wall, rss = samples[index]
        lines.append(f"| {done / 60:.1f} min | {index + 1} | {wall:.0f} | {rss:.0f} |")
    tail = [rss for _, _, rss in samples[9:]]
    lines.append(f"growth from window 10 to the end: {samples[-1][2] - samples[9][2]:+.0f} MB; "
                 f"max {max(tail):.0f} MB, min {min(tail):.0f} MB after window 10")
    print("\n".join(lines))
    data = {"minutes": args.minutes, "assistant": args.assistant, "batch_size": args.batch_size,
            "audio_seconds": total, "wall_seconds": wall_total, "rtf": result.stats.rtf,
            "segments": len(result.segments), "tokens": tokens, "rss_mb_before_audio": before,
            "samples": [{"audio_done_s": done, "wall_s": wall, "rss_mb": rss} for done, wall, rss in samples]}
    # The Markdown page: the two summary lines as a caption, a blank line, the table, the growth line.
    table = "\n".join([f"{lines[0]}. {lines[1]}.", "", *lines[2:-1], "", lines[-1] + "."])
    write_figures(args.out, data, table, command_line())


if __name__ == "__main__":
    main()
