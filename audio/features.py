"""Whisper's log-mel features for 30 s windows, computed by transformers' ``WhisperFeatureExtractor``."""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence

import numpy as np
import torch
from transformers import WhisperFeatureExtractor

from audio.constants import CHUNK_LENGTH, HOP_LENGTH, N_FFT, N_SAMPLES, SAMPLE_RATE

logger = logging.getLogger(__name__)


def pad_or_trim(audio: np.ndarray, length: int = N_SAMPLES) -> np.ndarray:
    """Zero-pad or cut samples to exactly ``length`` along the last axis.

    Args:
        audio: Samples ``[..., n_samples]``.
        length: The length to return.

    Returns:
        ``audio`` itself when it already has ``length`` samples, else a new array ``[..., length]``.
    """
    n_samples = audio.shape[-1]
    if n_samples > length:
        return audio[..., :length]
    if n_samples < length:
        widths = [(0, 0)] * (audio.ndim - 1) + [(0, length - n_samples)]
        return np.pad(audio, widths)
    return audio


@functools.lru_cache(maxsize=None)
def _extractor(n_mels: int) -> WhisperFeatureExtractor:
    # Building the mel filter bank takes a few ms; one extractor per n_mels serves every call.
    return WhisperFeatureExtractor(feature_size=n_mels, sampling_rate=SAMPLE_RATE, hop_length=HOP_LENGTH,
                                   chunk_length=CHUNK_LENGTH, n_fft=N_FFT)


def log_mel(audio: np.ndarray | list[np.ndarray], n_mels: int = 80, device: str = "cpu",
            floors: Sequence[float | None] | None = None) -> torch.Tensor:
    """Whisper's log-mel spectrogram of one or several clips, each zero-padded or cut to 30 s.

    Args:
        audio: Mono 16 kHz samples ``[n_samples]``, a batch ``[batch, n_samples]``, or a list of 1-D arrays of
            any lengths.
        n_mels: Mel bins: 80, or 128 for large-v3 and turbo (the model config's ``num_mel_bins``).
        device: Where the STFT runs (``"cuda"`` is faster for big batches); the result is on the CPU.
        floors: Per clip, its recording's floor (`recording_floor`) for a window cut from a longer recording,
            or None: the clip's own floor.

    Returns:
        Features ``[batch, n_mels, 3000]``, float32, on the CPU.

    Raises:
        ValueError: ``n_mels`` is not a positive integer, or ``audio`` holds no clip.
    """
    if not isinstance(n_mels, int) or n_mels <= 0:
        raise ValueError(f"n_mels must be a positive integer (80, or 128 for large-v3), got {n_mels!r}")
    clips = [audio] if isinstance(audio, np.ndarray) and audio.ndim == 1 else list(audio)
    if not clips:
        raise ValueError("log_mel needs at least one clip, got none")
    # Pad and cut here rather than in the extractor: one [batch, N_SAMPLES] float32 array skips its
    # per-clip padding code, and the result is the same.
    batch = np.stack([pad_or_trim(np.asarray(clip, dtype=np.float32)) for clip in clips])
    features = _extractor(n_mels)(batch, sampling_rate=SAMPLE_RATE, padding=False, truncation=False,
                                  return_tensors="np", device=device)["input_features"]
    for i, floor in enumerate(floors or ()):
        if floor is not None:
            np.maximum(features[i], floor, out=features[i])
    return torch.from_numpy(features)


# Whisper clamps a log-mel spectrogram (log10 units) at its largest value less 8, then divides by 4: the floor
# lies 2 below the largest feature.
_RANGE = 2.0


def recording_floor(samples: np.ndarray, n_mels: int = 80, windows_at_once: int = 8) -> float | None:
    """The floor of a whole recording's features, as openai-whisper and faster-whisper compute them: their
    log-mel spectrogram of the whole file is clamped at its largest value less 8 (log10 units), where a window's
    own spectrogram is clamped at the window's largest. Given to `log_mel` for windows cut from the recording,
    it keeps a quiet window (a last fraction of a second, a pause) at the file's silence level instead of
    stretching its noise over the whole range. Computed over 30 s pieces, `windows_at_once` at a time (memory
    stays bounded); None for a recording of one window, whose own floor it is.
    """
    if len(samples) <= N_SAMPLES:
        return None
    peak = -np.inf
    step = N_SAMPLES * windows_at_once
    for start in range(0, len(samples), step):
        pieces = [samples[s:s + N_SAMPLES] for s in range(start, min(len(samples), start + step), N_SAMPLES)]
        peak = max(peak, float(log_mel(pieces, n_mels).amax()))
    return peak - _RANGE
