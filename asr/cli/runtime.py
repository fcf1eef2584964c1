"""Command-line runtime settings shared by every command: device, precision and threads."""

from __future__ import annotations

from typing import Any, Callable

import click

from asr.constants import DEVICES, DTYPES, OFFLOADS, TEXT_DTYPES

__all__ = ["DEVICES", "DTYPES", "DTYPE_HELP", "TEXT_DTYPES", "offload_options", "parse_offload", "runtime_options",
           "setup_runtime"]

DTYPE_HELP = ("Model precision (auto: float32 on CPU, float16 on GPU; int8: CPU only, int8 decoder weights and a "
              "bfloat16 encoder; bfloat16 on CPUs with AVX512-BF16 or AMX).")


def offload_options(command: Callable) -> Callable:
    """Adds --offload, --offload-folder and --max-memory to a command (accelerate's device_map semantics)."""
    options = [
        click.option("--offload", type=click.Choice(OFFLOADS), default="none", show_default=True,
                     help="Keep the model's decoder layers on disk (on a CPU) or in CPU memory (on a GPU) and bring "
                          "them in per pass; the encoder, embeddings, head and the assistant stay resident."),
        click.option("--offload-folder", default=None, type=click.Path(file_okay=False),
                     help="Folder for the layer files of --offload disk (default: a temporary folder)."),
        click.option("--max-memory", default=None, metavar="SIZE",
                     help="Model weights allowed on the device (300MB, 2GiB); decoder layers beyond it are offloaded "
                          "(default with --offload: all of them)."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def runtime_options(threads_help: str) -> Callable[[Callable], Callable]:
    """Adds what every command that loads a Whisper model takes, in this order: --device, --dtype, the offload
    options and --threads (`threads_help` says what the threads do for that command)."""
    def add(command: Callable) -> Callable:
        command = click.option("--threads", type=int, default=None, help=threads_help)(command)
        command = offload_options(command)
        command = click.option("--dtype", type=click.Choice(DTYPES), default="auto", show_default=True,
                               help=DTYPE_HELP)(command)
        return click.option("--device", type=click.Choice(DEVICES), default="auto", show_default=True)(command)
    return add


def parse_offload(offload: str, folder: str | None, max_memory: str | None) -> Any:
    """The `asr.models.offload.OffloadOptions` for the three options, or None for none.

    Raises:
        click.BadParameter: a size that is not one.
    """
    from asr.models.offload import OffloadOptions, parse_size

    try:
        size = parse_size(max_memory) if max_memory is not None else None
    except ValueError as error:
        raise click.BadParameter(str(error).removeprefix("--max-memory: "), param_hint="--max-memory") from None
    options = OffloadOptions(device=None if offload == "none" else offload, folder=folder, max_memory=size)
    return options if options.enabled or folder is not None else None


def setup_runtime(device: str, dtype: str, threads: int | None):
    """Resolves --device/--dtype/--threads into torch settings and quiets transformers' progress bars.

    Returns:
        (device name, precision): a torch dtype, or "int8" (`asr.models.precision.resolve_precision`).

    Raises:
        click.BadParameter: threads < 1, a device this machine does not have, or a dtype it cannot run.
    """
    import torch
    from transformers.utils import logging as transformers_logging

    from asr.models.precision import resolve_precision
    from decoding.kernels.products import limit_kernel_caches

    limit_kernel_caches()
    transformers_logging.disable_progress_bar()
    if threads is not None:
        if threads < 1:
            raise click.BadParameter(f"must be >= 1, got {threads}", param_hint="--threads")
        torch.set_num_threads(threads)
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "mps" if torch.backends.mps.is_available() else "cpu"
    elif device == "cuda" and not torch.cuda.is_available():
        raise click.BadParameter("CUDA is not available on this machine", param_hint="--device")
    elif device == "mps" and not torch.backends.mps.is_available():
        raise click.BadParameter("MPS is not available on this machine", param_hint="--device")
    try:
        return device, resolve_precision(dtype, device)
    except ValueError as error:
        raise click.BadParameter(str(error), param_hint="--dtype") from None
