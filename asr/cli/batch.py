"""The `asr batch` command: parse, check the output, load the model, call `asr.batch.run.run_batch`, print the summary.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from asr.cli.options import assistant_to_load, transcription_options
from asr.cli.runtime import parse_offload, runtime_options, setup_runtime


@click.command("batch", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("source")
@click.option("--output", "-o", required=True, type=click.Path(dir_okay=False),
              help="Results file: one JSON line per item.")
@transcription_options
@click.option("--segments", is_flag=True, help="Keep each item's segments in its row.")
@click.option("--batch-size", default=1, show_default=True, type=int, help="Items transcribed together.")
@click.option("--chunked", is_flag=True,
              help="Cut items longer than 30 s into speech chunks (Silero VAD) that share the batch with other "
                   "items; faster for long items, whose words may differ from the sequential mode.")
@click.option("--workers", default=2, show_default=True, type=int,
              help="Threads decoding audio ahead of the model (0: decode inline).")
@click.option("--resume", is_flag=True, help="Continue an earlier run: skip the ids already in --output.")
@click.option("--retry-errors", is_flag=True,
              help="With --resume: transcribe again the items whose rows are errors (each id stays once).")
@click.option("--overwrite", is_flag=True, help="Delete earlier results (and parts) of --output and start again.")
@click.option("--audio-column", default="audio", show_default=True, help="Audio column of a dataset.")
@click.option("--text-column", default="text", show_default=True, help="Reference column of a dataset.")
@click.option("--split", default=None, help="Dataset split (default: test if there is one, else the first).")
@runtime_options(threads_help="Torch CPU threads per process (default: the cores shared among the processes on this "
                              "machine).")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
def batch_command(source, output, model, assistant, make_options, segments, batch_size, chunked, workers, resume,
                  retry_errors, overwrite, audio_column, text_column, split, device, dtype, offload, offload_folder,
                  max_memory, threads, quiet) -> None:
    """Transcribe every item of SOURCE (a folder, a JSONL/CSV manifest, or a dataset) into one JSON row each.

    A failed item gets a row with `error` and the run goes on; the exit status is then 1, as it is for an
    error that stops the run (a bad source or output, another run on the same output; 2 for a bad option).
    `--resume --retry-errors` transcribes the failed items again. Under
    `accelerate launch --multi_gpu --num_processes N -m asr batch ...` (`--multi_gpu` also on CPU-only
    machines: it is accelerate's torchrun launcher) the items are shared round-robin among the processes
    and merged into --output in input order.
    """
    from asr.assist.choose import load_pair
    from asr.batch.run import BatchOptions, prepare_output, run_batch
    from asr.batch.shards import detect_processes, finish, start_together

    output_path = Path(output)
    offloading = parse_offload(offload, offload_folder, max_memory)
    try:
        processes = detect_processes()
        batch = BatchOptions(audio_column=audio_column, text_column=text_column, split=split, batch_size=batch_size,
                             workers=workers, segments=segments, resume=resume, retry_errors=retry_errors,
                             overwrite=overwrite, progress=not quiet)
        options = make_options(batch_size=batch_size if chunked else None)
        assistant = assistant_to_load(assistant, options)
        lock = prepare_output(output_path, batch, processes)
    except ValueError as error:
        raise click.ClickException(str(error)) from None
    try:
        device, torch_dtype = _setup(device, dtype, threads, processes)
        start_together(processes, cpu=device == "cpu")
        try:
            bundle, chosen = load_pair(model, assistant, device=device, dtype=torch_dtype, offload=offloading,
                                       batched=chunked or batch_size > 1)
            summary = run_batch(source, output_path, bundle, chosen, options, batch, processes)
        except ValueError as error:
            raise click.ClickException(str(error)) from None
        finally:
            finish(processes)
    finally:
        if lock is not None:
            lock.release()
    if processes.is_main:
        click.echo(summary.describe(output), err=True)
        if summary.failed:
            sys.exit(1)


def _setup(device: str, dtype: str, threads: int | None, processes):
    """Resolves --device/--dtype/--threads for this process; returns (device, torch dtype)."""
    import torch

    if threads is None and processes.local_count > 1:
        # Processes on one machine share its cores; oversubscribed OpenMP threads slow everyone.
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        threads = max(1, cores // processes.local_count)
    device, torch_dtype = setup_runtime(device, dtype, threads)
    if device == "cuda" and processes.count > 1:
        device = f"cuda:{processes.local_index % torch.cuda.device_count()}"
    return device, torch_dtype

