"""Voice activity detection with Silero VAD: where in a recording someone speaks.

The `silero-vad` package ships the model files, so this works offline. Probabilities come from its "sequence"
ONNX model (one onnxruntime call per ~16 s block), the cheapest of its three forms, with the same regions as
the frame-by-frame ONNX and TorchScript models (`scripts/bench_vad.py` measures all three; docs/long-form.md).
The region rules (threshold, minimum speech and silence, padding, maximum length) are the package's own
`get_speech_timestamps_from_probs`, which faster-whisper's `VadOptions` mirror.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from audio.constants import SAMPLE_RATE

# Samples per VAD frame at 16 kHz.
FRAME_SAMPLES = 512


@dataclass(frozen=True)
class VadOptions:
    """Silero VAD's region rules; defaults are faster-whisper's `vad_filter` ones."""

    # A frame is speech above this probability; speech ends below `neg_threshold` (None: threshold - 0.15).
    threshold: float = 0.5
    neg_threshold: float | None = None
    # Speech shorter than this is dropped; silence shorter than this does not end a region.
    min_speech_duration_ms: int = 0
    min_silence_duration_ms: int = 2000
    # Regions longer than this are cut (at the longest pause inside when there is one); inf: never.
    max_speech_duration_s: float = math.inf
    # Added to both ends of every region.
    speech_pad_ms: int = 400

    def __post_init__(self) -> None:
        if not 0.0 < self.threshold < 1.0:
            raise ValueError(f"VAD threshold must be between 0 and 1, got {self.threshold}")
        if self.neg_threshold is not None and not 0.0 < self.neg_threshold < self.threshold:
            raise ValueError(f"VAD negative threshold must be between 0 and the threshold ({self.threshold}), "
                             f"got {self.neg_threshold}")
        for name in ("min_speech_duration_ms", "min_silence_duration_ms", "speech_pad_ms"):
            if getattr(self, name) < 0:
                raise ValueError(f"VAD {name} must be >= 0, got {getattr(self, name)}")
        if not self.max_speech_duration_s > 1.0:  # also refuses NaN
            raise ValueError(f"VAD max_speech_duration_s must be more than 1 s, got {self.max_speech_duration_s}")


@dataclass(frozen=True)
class SpeechRegion:
    """A stretch of speech, in samples of the 16 kHz recording: [start, end)."""

    start: int
    end: int

    @property
    def duration(self) -> float:
        return (self.end - self.start) / SAMPLE_RATE


def speech_regions(samples: np.ndarray, options: VadOptions = VadOptions()) -> list[SpeechRegion]:
    """Silero VAD's speech regions of 16 kHz mono samples, in order, not overlapping.

    Args:
        samples: `[n_samples]` float32 at 16 kHz.
        options: the region rules.

    Returns:
        The regions, padded as the options say and clipped to the recording.
    """
    return regions_of(speech_probabilities(samples), len(samples), options)


def regions_of(probabilities: np.ndarray, n_samples: int, options: VadOptions = VadOptions()) -> list[SpeechRegion]:
    """The speech regions that per-frame probabilities `[ceil(n_samples / 512)]` give under `options`'s rules."""
    found = silero().utils_vad.get_speech_timestamps_from_probs(
        probabilities.tolist(), sampling_rate=SAMPLE_RATE, threshold=options.threshold,
        neg_threshold=options.neg_threshold, min_speech_duration_ms=options.min_speech_duration_ms,
        min_silence_duration_ms=options.min_silence_duration_ms,
        max_speech_duration_s=options.max_speech_duration_s, speech_pad_ms=options.speech_pad_ms,
        audio_length_samples=n_samples,
    )
    return [SpeechRegion(int(r["start"]), int(r["end"])) for r in found if r["end"] > r["start"]]


def speech_probabilities(samples: np.ndarray) -> np.ndarray:
    """Per-frame (32 ms) speech probabilities from the sequence ONNX model, `[ceil(n_samples / 512)]` float32."""
    samples = np.ascontiguousarray(samples, dtype=np.float32)
    if samples.size == 0:
        return np.zeros(0, dtype=np.float32)
    return _model().audio_forward(samples)


@functools.lru_cache(maxsize=None)
def silero():
    """The silero_vad package, imported without its side effect: importing it sets torch's thread count to 1
    for the whole process (which halved the speed of every encoder pass after the first VAD call)."""
    import torch

    threads = torch.get_num_threads()
    try:
        import silero_vad
        import silero_vad.utils_vad

        return silero_vad
    finally:
        torch.set_num_threads(threads)


@functools.lru_cache(maxsize=None)
def _model():
    return silero().load_silero_vad(onnx=False, sequence=True)
