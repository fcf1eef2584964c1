"""What one step costs for `base` in each precision and with each kernel choice (issue: a cheaper step).

    python scripts/bench_precision.py [--threads 2] [--out docs/figures/precision-steps]

For PyTorch's default kernels in float32 (the kernels before oneDNN: `reference_kernels()`), this
library's kernels in float32 with every logit of the head in float32 (before the bfloat16 screen:
`full_head()`), and this library's kernels in float32 (the head screened as greedy decoding
screens it), bfloat16 (where the CPU has it) and int8: the encoder per 30 s window, a
model decoder pass over 1, 6 and 11 tokens (one step, and the check of 5 and 10 drafts), and one draft step of
the `base-draft` and `self:int8` assistants. Configurations are measured in turn, round after round, and each
figure is the median over rounds, so a machine that slows down mid-run slows all of them alike. The encoder
output comes from noise: the speed does not depend on what the audio says.

Writes docs/figures/precision-steps.json and docs/figures/precision-steps.md (the table in docs/precision.md;
`--out` to change).
"""

from __future__ import annotations

import argparse
import statistics

import torch
from benchlib import command_line, figure_path, timed, use_threads, write_figures

from asr.assist.choose import make_assistant
from asr.models.precision import INT8, native_bfloat16
from asr.models.registry import load_model
from asr.whisper.decoder import WhisperDecoderAdapter
from asr.whisper.logit_rules import screen_exact_ids, whisper_filters
from asr.whisper.window import encode
from decoding.kernels.products import reference_kernels

WIDTHS = (1, 6, 11)
PROMPT = [50258, 50259, 50359, 50364]


def timed_ms(fn, repeats: int) -> float:
    """Milliseconds per call: one warm-up, then `repeats` calls back to back."""
    return 1000 * timed(fn, repeats, mean=True)


class Setup:
    """One configuration: a loaded model (and its drafts) with a decoder over one window of noise."""

    def __init__(self, name: str, precision, reference: bool, screen: bool = False) -> None:
        self.name, self.reference = name, reference
        self.bundle = load_model("base", dtype=precision)
        self.features = torch.randn(1, self.bundle.n_mels, 3000, generator=torch.Generator().manual_seed(0))
        with reference_kernels(reference):
            encoder_output = encode(self.bundle.model, self.features)
            self.decoder = WhisperDecoderAdapter(self.bundle.model, encoder_output)
            if screen:
                special = self.bundle.special
                filters = whisper_filters(special, len(PROMPT), timestamps=True)
                self.decoder = self.decoder.screened(screen_exact_ids(filters, special, self.decoder.vocab_size))
            self.drafts = {}
            for spec in ("base-draft", "self:int8"):
                assistant = make_assistant(spec, self.bundle)
                self.drafts[spec] = WhisperDecoderAdapter(assistant.decoder_model, encoder_output)

    def measure(self, repeats: int) -> dict[str, float]:
        out: dict[str, float] = {}
        with reference_kernels(self.reference):
            out["encoder_ms"] = timed_ms(lambda: encode(self.bundle.model, self.features), 2)
            for width in WIDTHS:
                out[f"pass_{width}_ms"] = _pass_ms(self.decoder, width, repeats)
            for spec, draft in self.drafts.items():
                out[f"draft_{spec}_ms"] = _pass_ms(draft, 1, repeats)
        return out


def _pass_ms(decoder: WhisperDecoderAdapter, width: int, repeats: int) -> float:
    """One pass over `width` new tokens after a 4-token prompt and 40 decoded tokens."""
    cache = decoder.new_cache(1)
    decoder.forward(torch.tensor([PROMPT + list(range(400, 440))]), cache, 1)
    ids = torch.arange(1000, 1000 + width)[None]

    def one() -> None:
        decoder.forward(ids, cache, width)
        cache.crop(44)

    return timed_ms(one, repeats)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--out", default=str(figure_path("precision-steps")), help="writes OUT.json and OUT.md")
    args = parser.parse_args()
    use_threads(args.threads)
    configs = [("float32, PyTorch kernels", torch.float32, True), ("float32, full head", torch.float32, False),
               ("float32", torch.float32, False, True)]
    if native_bfloat16():
        configs.append(("bfloat16", torch.bfloat16, False))
    configs.append(("int8", INT8, False))
    setups = [Setup(*config) for config in configs]
    rounds: dict[str, list[dict[str, float]]] = {s.name: [] for s in setups}
    for _ in range(args.rounds):
        for setup in setups:
            rounds[setup.name].append(setup.measure(args.repeats))
    figures = {name: {key: round(statistics.median(r[key] for r in runs), 2) for key in runs[0]}
               for name, runs in rounds.items()}
    report = {"rounds": args.rounds, "repeats": args.repeats, "native_bfloat16": native_bfloat16(), "figures": figures}
    columns = ["encoder_ms", *(f"pass_{w}_ms" for w in WIDTHS), "draft_base-draft_ms", "draft_self:int8_ms"]
    heads = ["encoder (window)", *(f"pass, {w} token{'s' * (w > 1)}" for w in WIDTHS), "base-draft step",
             "self:int8 step"]
    lines = [f"Milliseconds, medians of {args.rounds} interleaved rounds.", "",
             "| configuration | " + " | ".join(heads) + " |", "|---" * (len(heads) + 1) + "|"]
    for name, row in figures.items():
        lines.append(f"| {name} | " + " | ".join(f"{row[c]:.1f}" for c in columns) + " |")
    write_figures(args.out, report, "\n".join(lines), command_line())
    print("\n".join(lines))


if __name__ == "__main__":
    main()
