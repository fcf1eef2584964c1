"""How well and how cheaply a draft model drafts for `base`: agreement, acceptance and step costs.

    python scripts/bench_draft.py [--drafts base-draft] [--threads 2] [--out docs/figures/draft]

1. Teacher-forced agreement on the 65 English WER recordings of ../shared/evaldata (61 short ones and 4 long
   files: the three sonnets and the VoxPopuli speech): `base` decodes each one greedily (long-form algorithm,
   as in real use); at every position the draft's best token (Whisper's suppressed tokens masked) is compared
   with `base`'s token.
2. Acceptance in real assisted decoding of the same recordings: drafted and accepted tokens, tokens per round,
   model passes per token, and whether the words equal plain greedy's.
3. Step costs in place (medians): the model's pass over 1 and 6 tokens, each draft's step in fp32 and int8,
   and the output head's share of it.

Writes docs/figures/draft.json and docs/figures/draft.md (`--out` to change) and prints the tables. Speed end
to end, side by side with faster-whisper, comes from `asr eval` (docs/drafts.md names the command).
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
from benchlib import (
    command_line,
    figure_path,
    load,
    timed,
    use_threads,
    wer_items,
    write_figures,
)

from asr.assist.choose import draft_folder, make_assistant
from asr.assist.draft_model import load_draft
from asr.distill.data import window_from_decoded
from asr.distill.train import agreement
from asr.transcription import transcribe, transcribe_many
from asr.models.registry import load_model
from asr.options import TranscribeOptions
from asr.whisper.decoder import WhisperDecoderAdapter

FOLDERS = ("librispeech", "ljspeech", "fleurs", "clips", "spontaneous", "longform")


def english_recordings() -> list[tuple[str, str, np.ndarray]]:
    """(subset, id, samples) of the 65 English WER recordings."""
    return [(item["subset"], item["id"].split("/", 1)[1], load(item["audio"])) for item in wer_items(FOLDERS)]


def median_ms(fn, repeats: int = 60) -> float:
    return 1000 * timed(fn, repeats, warmup=5)


def step_costs(bundle, drafts: dict[str, object], encoder_output: torch.Tensor) -> dict[str, float]:
    """Milliseconds per decoder pass at position ~60, in place (the model's buffers and weights loaded)."""
    costs = {}
    prompt = torch.tensor([[50258, 50259, 50359] + [400 + i for i in range(57)]])

    def pass_cost(module, width: int) -> float:
        decoder = WhisperDecoderAdapter(module, encoder_output)
        cache = decoder.new_cache(1)
        decoder.forward(prompt, cache, 1)
        ids = torch.full((1, width), 500)

        def one() -> None:
            decoder.forward(ids, cache, width)
            cache.crop(60)

        return median_ms(one)

    costs["model, 1 token"] = pass_cost(bundle.model, 1)
    costs["model, 6 tokens"] = pass_cost(bundle.model, 6)
    for name, module in drafts.items():
        costs[f"{name}, 1 token"] = pass_cost(module, 1)
    head = bundle.model.get_output_embeddings()
    x = torch.randn(1, 1, bundle.model.config.d_model)
    with torch.inference_mode():
        costs["fp32 output head alone"] = median_ms(lambda: head(x))
    return costs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--drafts", default="base-draft", help="comma-separated draft names or folders")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default=str(figure_path("draft")), help="writes OUT.json and OUT.md")
    args = parser.parse_args()
    use_threads(args.threads)
    bundle = load_model("base")
    recordings = english_recordings()
    options = TranscribeOptions(language="en")

    # 1. base's own greedy windows of every recording, with the tokens it chose.
    windows: dict[str, list] = {}
    for subset, _, samples in recordings:
        decoded = []
        transcribe_many(bundle, [samples], options, window_observer=decoded.append)
        windows.setdefault(subset, []).extend(window_from_decoded(bundle, w, 1) for w in decoded
                                              if w.temperature == 0.0 and w.tokens)
    special = bundle.special
    results: dict[str, dict] = {}
    modules = {}
    for name in args.drafts.split(","):
        folder = draft_folder(name)
        if folder is None:
            raise SystemExit(f"{name}: not a draft model name or folder")
        draft = load_draft(folder, bundle.model)
        modules[name] = draft
        per_subset = {s: agreement(draft, w, eot=special.eot, suppress=special.suppress_tokens)
                      for s, w in windows.items()}
        matched = sum(a.matched for a in per_subset.values())
        positions = sum(a.positions for a in per_subset.values())
        short = [a for s, a in per_subset.items() if s != "longform"]
        results[name] = {"agreement": matched / positions, "positions": positions,
                         "agreement_short": sum(a.matched for a in short) / sum(a.positions for a in short),
                         "by_subset": {s: round(a.rate, 4) for s, a in per_subset.items()}}
        print(f"{name}: teacher-forced agreement {matched / positions:.1%} over {positions} positions "
              f"({results[name]['agreement_short']:.1%} on the 61 short recordings) {results[name]['by_subset']}",
              flush=True)

    # 2. Real assisted decoding: acceptance and exactness against plain greedy.
    plain = [transcribe(bundle, samples, options) for _, _, samples in recordings]
    specs = [spec for name in args.drafts.split(",") for spec in (name, f"{name}:int8")]
    for spec in specs:
        assistant = make_assistant(spec, bundle)
        drafted = accepted = rounds = passes = generated = 0
        same = True
        for (_, _, samples), reference in zip(recordings, plain):
            result = transcribe(bundle, samples, options, assistant)
            same &= [s.tokens for s in result.segments] == [s.tokens for s in reference.segments]
            g = result.stats.generation
            drafted += g.drafted_tokens
            accepted += g.accepted_tokens
            rounds += g.rounds
            passes += g.model_forward_passes
            generated += g.generated_tokens
        results.setdefault(spec, {}).update({
            "acceptance_rate": accepted / max(1, drafted), "tokens_per_round": generated / max(1, rounds),
            "model_passes_per_token": passes / max(1, generated), "same_words_as_greedy": same})
        print(f"{spec}: acceptance {accepted / max(1, drafted):.1%}, {generated / max(1, rounds):.2f} tokens a "
              f"round, {passes / max(1, generated):.3f} model passes a token, same words: {same}", flush=True)

    # 3. Step costs in place.
    encoder_output = torch.randn(1, 1500, bundle.model.config.d_model)
    step_modules = {}
    for name in modules:
        step_modules[f"{name} fp32"] = make_assistant(name, bundle).decoder_model
        step_modules[f"{name} int8"] = make_assistant(f"{name}:int8", bundle).decoder_model
    step_modules["self:int8"] = make_assistant("self:int8", bundle).decoder_model
    costs = step_costs(bundle, step_modules, encoder_output)
    for key, value in costs.items():
        print(f"{key}: {value:.2f} ms", flush=True)

    report = {"drafts": results, "step_ms": {k: round(v, 2) for k, v in costs.items()},
              "recordings": len(recordings), "windows": sum(len(w) for w in windows.values())}
    lines = [("| assistant | teacher-forced agreement: the 65 recordings / the 61 short ones | acceptance (real "
              "decoding) | tokens / round | model passes / token | same words |"),
             "| --- | ---: | ---: | ---: | ---: | --- |"]
    for spec, row in results.items():
        agree = f"{row['agreement']:.1%} / {row['agreement_short']:.1%}" if "agreement" in row else "-"
        lines.append(f"| {spec} | {agree} | {row.get('acceptance_rate', 0):.1%} | {row.get('tokens_per_round', 0):.2f} "
                     f"| {row.get('model_passes_per_token', 0):.3f} | {row.get('same_words_as_greedy')} |")
    lines += ["", "| pass | ms (median) |", "| --- | ---: |"]
    lines += [f"| {k} | {v:.2f} |" for k, v in costs.items()]
    write_figures(args.out, report, "\n".join(lines), command_line())
    print("\n".join(lines))


if __name__ == "__main__":
    main()
