"""What the screen (int8 for a few rows, bfloat16 for more) of `base`'s float32 head saves on real speech
(decoding/kernels/screened_head.py).

    python scripts/bench_screened_head.py [--threads 2] [--out docs/figures/screened-head]

Decodes the second sonnet (longform/p002.mp3) once with `base-draft:int8` drafting rounds of 3 and keeps the decoder
outputs the head saw (one row for a step, several for a check of drafts); then times the head over the same
rows with and without the screen, in turn, and counts the logits the screen computed again in float32. Real
rows matter: on noise the logits are flat and the screen recomputes hundreds a row, on speech a few.

Writes docs/figures/screened-head.json and .md (`--out` to change).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from benchlib import EVALDATA, command_line, figure_path, use_threads, write_figures

import decoding.kernels.screened_head as screened
from asr.assist.choose import make_assistant
from asr.transcription import transcribe
from asr.models.registry import load_model
from asr.options import TranscribeOptions
from asr.whisper.logit_rules import screen_exact_ids, whisper_filters
from audio.load import load_audio
from decoding.causal_lm import linear_fn


def decoder_outputs(bundle) -> list[torch.Tensor]:
    """The rows the screened head was called on while the sonnet was decoded."""
    seen: list[torch.Tensor] = []
    call = screened.ScreenedHead.__call__

    def record(self, h: torch.Tensor) -> torch.Tensor:
        seen.append(h.detach().clone())
        return call(self, h)

    screened.ScreenedHead.__call__ = record
    try:
        transcribe(bundle, load_audio(str(EVALDATA / "longform" / "p002.mp3")),
                   TranscribeOptions(schedule="constant", num_assistant_tokens=3), make_assistant("base-draft:int8", bundle))
    finally:
        screened.ScreenedHead.__call__ = call
    return seen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", default=str(figure_path("screened-head")), help="writes OUT.json and OUT.md")
    args = parser.parse_args()
    use_threads(args.threads)
    bundle = load_model("base")
    special = bundle.special
    head = bundle.model.get_output_embeddings()
    vocab = head.weight.shape[0]
    exact = screen_exact_ids(whisper_filters(special, 4, timestamps=True), special, vocab)
    screen, full = screened.screened_head(head, exact), linear_fn(head)
    checks = [h for h in decoder_outputs(bundle) if h.shape[1] == 4]  # the last token and 3 drafts
    rows = {width: [h[:, -width:].contiguous() for h in checks] for width in (1, 2, 3, 4)}
    times: dict[str, list[float]] = {}
    refined: dict[int, float] = {}
    with torch.inference_mode():
        for _ in range(args.rounds):
            for width, inputs in rows.items():
                for name, fn in (("full", full), ("screened", screen)):
                    screen.refined = 0
                    spent = []
                    for h in inputs:
                        start = time.perf_counter()
                        fn(h)
                        spent.append(time.perf_counter() - start)
                    times.setdefault(f"{name}_{width}", []).append(1000 * statistics.median(spent))
                    if name == "screened":
                        refined[width] = screen.refined / (len(inputs) * width)
    figures = {key: round(statistics.median(values), 2) for key, values in times.items()}
    lines = [f"`base`'s head over the decoder outputs of one sonnet ({len(checks)} checks of 3 drafts): "
             f"milliseconds a call, medians over the calls, then over {args.rounds} interleaved rounds.", "",
             "| rows | float32 head | screened head | saved | logits recomputed a row |", "|---|---|---|---|---|"]
    for width in rows:
        before, after = figures[f"full_{width}"], figures[f"screened_{width}"]
        lines.append(f"| {width} | {before:.2f} | {after:.2f} | {before - after:.2f} | {refined[width]:.1f} |")
    write_figures(args.out, {"rounds": args.rounds, "calls": len(checks), "figures": figures,
                             "recomputed_per_row": refined}, "\n".join(lines), command_line())
    print("\n".join(lines))


if __name__ == "__main__":
    main()
