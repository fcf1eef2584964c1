"""Command-line runtime settings shared by every command: device, precision and threads."""

from __future__ import annotations

import click

DEVICES = ("auto", "cpu", "cuda", "mps")
DTYPES = ("auto", "float32", "float16", "bfloat16")


def setup_runtime(device: str, dtype: str, threads: int | None):
    """Resolves --device/--dtype/--threads into torch settings and quiets transformers' progress bars.

    Returns:
        (device name, torch dtype): float32 on a CPU and float16 elsewhere when `dtype` is auto.

    Raises:
        click.BadParameter: threads < 1, or a device this machine does not have.
    """
    import torch
    from transformers.utils import logging as transformers_logging

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
    if dtype == "auto":
        dtype = "float32" if device == "cpu" else "float16"
    return device, getattr(torch, dtype)
