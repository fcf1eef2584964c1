"""Transcribing several audios together (`asr batch --batch-size N`)."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from asr.options import TranscribeOptions
from asr.results import Transcript
from asr.transcribe import transcribe_many


def transcribe_batch(bundle: Any, audios: Sequence[np.ndarray], options: TranscribeOptions = TranscribeOptions(),
                     assistant: Any = None) -> list[Transcript]:
    """Transcribes `audios` (16 kHz mono float32) as one batch; the words for each are those `transcribe` gives.

    Args:
        bundle: a loaded model.
        audios: decoded audio, one array per item.
        options: as for `transcribe`.
        assistant: as for `transcribe`.

    Returns:
        One transcript per audio, in order.
    """
    return transcribe_many(bundle, audios, options, assistant, batch_size=max(len(audios), 1))
