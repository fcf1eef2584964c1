"""`asr generate`: assisted generation for a pair of causal text language models."""

from __future__ import annotations

import json

import click

from asr.cli.runtime import DEVICES, setup_runtime
from asr.constants import TEXT_DTYPES
from decoding.schedule import SCHEDULES


@click.command("generate")
@click.option("--model", required=True, help="Causal LM: local folder or hub id.")
@click.option("--assistant", default=None, help="Assistant causal LM (same or different tokenizer).")
@click.option("--prompt", required=True, help="Text to continue.")
@click.option("--max-new-tokens", default=64, show_default=True, type=int)
@click.option("--temperature", default=0.0, show_default=True, type=float, help="0 is greedy.")
@click.option("--top-k", default=None, type=int)
@click.option("--top-p", default=None, type=float)
@click.option("--seed", default=None, type=int, help="Seed for sampling.")
@click.option("--num-assistant-tokens", default=5, show_default=True, type=int)
@click.option("--schedule", type=click.Choice(SCHEDULES), default="heuristic",
              show_default=True)
@click.option("--prompt-lookup", is_flag=True, help="Draft by n-gram lookup in the text instead of an assistant.")
@click.option("--device", type=click.Choice(DEVICES), default="auto", show_default=True)
@click.option("--dtype", type=click.Choice(TEXT_DTYPES), default="auto", show_default=True)
@click.option("--threads", type=int, default=None)
@click.option("--json", "as_json", is_flag=True, help="Print tokens, text and stats as one JSON object.")
def generate(model, assistant, prompt, max_new_tokens, temperature, top_k, top_p, seed, num_assistant_tokens,
             schedule, prompt_lookup, device, dtype, threads, as_json) -> None:
    """Assisted generation for a causal text LM (plain decoding without --assistant)."""
    from decoding import GenerationOptions, SamplingOptions
    from decoding.text import generate_text, load_text_model

    device, torch_dtype = setup_runtime(device, dtype, threads)
    try:
        options = GenerationOptions(
            max_new_tokens=max_new_tokens, sampling=SamplingOptions(temperature, top_k, top_p), seed=seed,
            schedule=schedule, num_assistant_tokens=num_assistant_tokens,
        )
        if assistant is not None and prompt_lookup:
            raise ValueError("choose either --assistant or --prompt-lookup, not both")
        text_model = load_text_model(model, device=device, dtype=torch_dtype)
        assistant_model = load_text_model(assistant, device=device, dtype=torch_dtype) if assistant else None
        result, text = generate_text(text_model, prompt, options, assistant_model, prompt_lookup)
    except ValueError as error:
        raise click.ClickException(str(error)) from None
    if as_json:
        click.echo(json.dumps({"tokens": result.tokens, "text": text, "stats": result.stats.to_dict()},
                              ensure_ascii=False))
    else:
        click.echo(text)
