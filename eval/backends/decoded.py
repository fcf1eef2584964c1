"""What an evaluation backend returns (`Decoded`), the interface every backend has (`Backend`), and
`BackendUnavailable`: the small vocabulary that `eval.backends`, `eval.backends.ctranslate2`, the runner and the
metrics share, kept apart so that none of them imports another for it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from eval.configs import EvalConfig


class BackendUnavailable(Exception):
    """A configuration that cannot run on this machine (a package or a model form is missing)."""


@dataclass
class Decoded:
    """What one configuration made of one item, and where the time went (None: the backend cannot tell)."""

    text: str
    # Language the text is in (given or detected), when the backend says.
    language: str | None = None
    # Wall time of the whole call, set by the runner, which times every backend alike.
    seconds: float = 0.0
    # Encoder passes (model and assistant) and the rest of decoding.
    encode_seconds: float | None = None
    decode_seconds: float | None = None
    # Tokens produced, and forward passes of the model and the assistant that produced them.
    generated_tokens: int | None = None
    model_forward_passes: int | None = None
    assistant_forward_passes: int | None = None
    # Drafts checked, drafts kept, verification rounds, and accepted drafts per round -> rounds.
    drafted_tokens: int | None = None
    accepted_tokens: int | None = None
    rounds: int | None = None
    accepted_length_histogram: dict[int, int] | None = None
    # The assistant that drafted (this library's configurations: its name, or "none").
    assistant: str | None = None


class Backend(Protocol):
    """One configuration, ready to decode items."""

    config: EvalConfig

    def decode(self, samples: np.ndarray, language: str | None) -> Decoded:
        """Transcribes 16 kHz mono float32 samples; `language` None means detect."""
