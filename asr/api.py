"""The library calls behind the CLI: load a model with its assistant, transcribe one file with progress."""

from __future__ import annotations

import sys
from typing import Any

import torch

from asr.assistants import make_assistant
from asr.offload import OffloadOptions
from asr.options import TranscribeOptions
from asr.precision import Precision
from asr.registry import load_model
from asr.results import Transcript
from asr.transcribe import transcribe

__all__ = ["OffloadOptions", "TranscribeOptions", "load_pair", "transcribe_file"]

# Files longer than this get a progress bar (one 30 s window is over quickly).
PROGRESS_MIN_SECONDS = 60.0


def load_pair(model: str, assistant: str = "none", *, device: str = "cpu", dtype: Precision = torch.float32,
              offload: OffloadOptions | None = None) -> tuple[Any, Any]:
    """Loads the model (offloading its decoder layers if asked: `asr.offload`) and resolves `assistant` for it
    (see `asr.assistants.make_assistant`).

    Raises:
        ValueError: an unknown model or assistant, a pair that cannot work together, or offload options that
            cannot be honoured.
    """
    bundle = load_model(model, device=device, dtype=dtype, offload=offload)
    return bundle, make_assistant(assistant, bundle, device=device, dtype=dtype)


def transcribe_file(bundle: Any, path: str, options: TranscribeOptions, assistant: Any = None,
                    show_progress: bool = True) -> Transcript:
    """Transcribes one file, with a progress bar on stderr for long audio."""
    bar = None

    def progress(done: float, total: float) -> None:
        nonlocal bar
        if bar is None and total >= PROGRESS_MIN_SECONDS:
            from tqdm import tqdm

            bar = tqdm(total=round(total, 1), unit="s", desc=str(path), file=sys.stderr, leave=False)
        if bar is not None:
            bar.update(round(done, 1) - bar.n)

    try:
        return transcribe(bundle, path, options, assistant, progress if show_progress else None)
    finally:
        if bar is not None:
            bar.close()
