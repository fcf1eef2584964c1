"""`asr eval`: WER, latency and exactness of several decoding configurations, side by side, as a report.

The `asr` group adds it with `main.add_command(eval_command)`; heavy imports stay inside the command.
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

import click

from asr.cli.runtime import parse_offload, runtime_options


@click.command("eval")
@click.argument("sources", nargs=-1, required=True)
@click.option("--model", default="base", show_default=True, help="Model name (see `asr models`), hub id or folder.")
@click.option("--compare", "compare", multiple=True, metavar="CONFIG",
              help="A configuration, repeatable; the first is the reference for speed-ups and exactness: "
                   "greedy[,vad], assisted:NAME[,schedule=S][,k=N][,temperature=T][,vad], "
                   "batched:N[,assistant=NAME][,timestamps=on|off], beam:N[,best_of=M][,patience=P] (beam search, "
                   "openai-whisper's command line: beam:5), transformers, "
                   "transformers-assisted:NAME[,k=N], faster-whisper[,compute_type=C][,batched=N][,beam=N]. "
                   "Default: greedy and assisted:self:int8 (self:fp16 off the CPU).")
@click.option("--hypotheses", "hypotheses", multiple=True, metavar="FILE[:NAME]",
              help="Stored transcripts to score beside the configurations, repeatable: `asr batch` rows, JSONL or "
                   "CSV with an id and a text, or a folder of ITEM.txt; matched by id (docs/eval.md).")
@click.option("--report", "report_dir", required=True, type=click.Path(file_okay=False),
              help="Folder for report.md, report.json, items.jsonl and the plots.")
@click.option("--resume", is_flag=True, help="Continue the run whose items.jsonl is in --report (a stopped or killed "
                                            "run): its items are not decoded again.")
@click.option("--language", default=None, help="Decode and score every item in this language (default: each "
                                                 "item's own, else detected).")
@click.option("--limit", type=int, default=None, help="Only the first N items.")
@click.option("--batch-size", type=int, default=1, show_default=True,
              help="Items decoded together by this library's configurations (as `asr batch --batch-size`); each "
                   "configuration is then timed as a whole (RTFx), not per item.")
@click.option("--audio-column", default="audio", show_default=True, help="Dataset column with the audio.")
@click.option("--text-column", default="text", show_default=True, help="Dataset column with the reference.")
@runtime_options(threads_help="Torch CPU threads (faster-whisper gets as many).")
@click.option("--quiet", "-q", is_flag=True, help="No line per item.")
def eval_command(sources, model, compare, hypotheses, report_dir, resume, language, limit, batch_size, audio_column,
                 text_column, device, dtype, offload, offload_folder, max_memory, threads, quiet) -> None:
    """Compare decoding configurations on SOURCE... (folders, manifests with `text`, datasets): WER, latency
    and exactness, written to --report DIR as tables, JSON and plots."""
    from eval.evaluate import evaluate
    from eval.report import write_report
    from eval.runner import Failure

    try:  # an unwritable report folder should fail now, not after the run
        Path(report_dir).mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise click.BadParameter(f"cannot create {report_dir}: {error.strerror or error}",
                                 param_hint="--report") from None
    device, torch_dtype = _setup(device, dtype, threads)
    offloading = parse_offload(offload, offload_folder, max_memory)
    if not compare and not hypotheses:
        compare = ("greedy", "assisted:self:int8" if device == "cpu" else "assisted:self:fp16")

    def on_message(text: str) -> None:
        click.echo(f"warning: {text}", err=True)

    def on_item(item, outcomes) -> None:
        if quiet:
            return
        parts = [f"{name} failed" if isinstance(o, Failure) else f"{name} {o.seconds:.2f} s"
                 if o.seconds and batch_size == 1 else name
                 for name, o in outcomes.items()]
        click.echo(f"{item.id} ({item.audio_seconds:.1f} s): " + " | ".join(parts), err=True)

    try:
        report = evaluate(sources, compare, model=model, language=language, limit=limit, device=device,
                          dtype=torch_dtype, audio_column=audio_column, text_column=text_column,
                          on_message=on_message, on_item=on_item, offload=offloading, hypotheses=hypotheses,
                          folder=report_dir, resume=resume, batch_size=batch_size)
    except ValueError as error:
        raise click.ClickException(str(error)) from None
    if report is None:  # another process of `accelerate launch`: process 0 writes the report
        return
    report["run"]["command"] = shlex.join(["asr", "eval", *sys.argv[2:]]) if sys.argv[1:2] == ["eval"] else None
    write_report(report, report_dir)
    for config in report["configurations"]:
        wer = "-" if config["wer"] is None else f"{100 * config['wer']:.2f} %"
        rtf = "-" if config["median_rtf"] is None else f"{config['median_rtf']:.3f}"
        speedup = "-" if config["speedup"] is None else f"{config['speedup']:.2f}x"
        exact = "-" if config["exact_match_rate"] is None else f"{100 * config['exact_match_rate']:.0f} %"
        click.echo(f"{config['name']}: WER {wer}, median RTF {rtf}, speed-up {speedup}, exact {exact}")
    click.echo(f"report written to {report_dir}/report.md")
    if report["items_decodable"] == 0:
        click.echo("error: no item could be decoded (see the report's problems)", err=True)
        sys.exit(1)


def _setup(device: str, dtype: str, threads: int | None):
    """The shared runtime settings, and transformers quiet: its generate() warns about its own defaults on every
    call, and the report says what ran."""
    from transformers.utils import logging as transformers_logging

    from asr.cli.runtime import setup_runtime

    from asr.batch.shards import detect_processes

    processes = detect_processes()
    if threads is None and processes.local_count > 1:  # processes on one machine share its cores
        threads = max(1, (os.cpu_count() or 1) // processes.local_count)
    resolved = setup_runtime(device, dtype, threads)
    transformers_logging.set_verbosity_error()
    return resolved
