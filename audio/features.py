"""Whisper's log-mel features for 30 s windows, framed, clamped and padded as openai-whisper's `transcribe()` has
them (the mel filter bank is transformers' ``WhisperFeatureExtractor``'s)."""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence

import numpy as np
import torch
from transformers import WhisperFeatureExtractor

from audio.constants import CHUNK_LENGTH, HOP_LENGTH, N_FFT, N_FRAMES, N_SAMPLES, SAMPLE_RATE

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
    # transformers' extractor holds Whisper's mel filter bank (building it takes a few ms: once per n_mels).
    return WhisperFeatureExtractor(feature_size=n_mels, sampling_rate=SAMPLE_RATE, hop_length=HOP_LENGTH,
                                   chunk_length=CHUNK_LENGTH, n_fft=N_FFT)


@functools.lru_cache(maxsize=None)
def _filters(n_mels: int, device: str) -> torch.Tensor:
    return torch.from_numpy(_extractor(n_mels).mel_filters.T.copy()).to(device, torch.float32)


# Samples an STFT frame reaches on either side of its centre.
_REACH = N_FFT // 2


def margins(samples: np.ndarray, start: int, end: int) -> tuple[np.ndarray, np.ndarray]:
    """The samples the STFT frames at the edges of ``samples[start:end]`` see around it, as openai-whisper's
    spectrogram of the whole recording has them: the recording before and after (its first samples mirrored
    before its start, as a centred STFT pads; zeros after its end, as openai-whisper pads it with 30 s of zeros).
    """
    before = samples[max(0, start - _REACH):start]
    if len(before) < _REACH:
        mirrored = samples[1:_REACH + 1][::-1]
        before = np.concatenate([mirrored, samples[:start]])[-_REACH:]
    after = samples[end:end + _REACH]
    return before, after


def log_mel(audio: np.ndarray | list[np.ndarray], n_mels: int = 80, device: str = "cpu",
            floors: Sequence[float | None] | None = None, pad_with_silence: bool = False,
            around: Sequence[tuple[np.ndarray, np.ndarray] | None] | None = None) -> torch.Tensor:
    """Whisper's log-mel spectrogram of one or several clips, each padded or cut to 30 s, computed as
    openai-whisper computes its windows' features (docs/parity.md).

    A clip shorter than 30 s is padded as openai-whisper pads a window it decodes: its frames past the clip's end
    (from ``len(clip) // HOP_LENGTH`` on) are 0 in the normalised features, not the spectrogram of padded
    silence (which lies near the floor). The two differ markedly to the model: with silence's frames, greedy
    decoding parted from openai-whisper's and faster-whisper's on 21 of 50 FLEURS clips.

    Args:
        audio: Mono 16 kHz samples ``[n_samples]``, a batch ``[batch, n_samples]``, or a list of 1-D arrays of
            any lengths.
        n_mels: Mel bins: 80, or 128 for large-v3 and turbo (the model config's ``num_mel_bins``).
        device: Where the STFT runs (``"cuda"`` is faster for big batches); the result is on the CPU.
        floors: Per clip, its recording's floor (`recording_floor`) for a window cut from a longer recording,
            or None: the clip's own floor.
        pad_with_silence: Pad with the spectrogram of zero samples instead (openai-whisper's language detection
            sees the first 30 s of the padded file's spectrogram, so its padding is this one).
        around: Per clip, the samples just before and after it in its recording (`margins`), which the STFT
            frames at its edges reach into; None (or a None entry): a clip of its own (mirrored before its start,
            silence after its end).

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
    # Each row: the samples before the clip, the clip (at most 30 s), the samples after it, zeros to the
    # length whose uncentred frames are the clip's 3000 centred ones.
    rows = np.zeros((len(clips), _REACH + N_SAMPLES + _REACH), dtype=np.float32)
    lengths = []
    for i, clip in enumerate(clips):
        clip = np.asarray(clip, dtype=np.float32)
        n = min(len(clip), N_SAMPLES)
        before, after = around[i] if around is not None and around[i] is not None else margins(clip, 0, n)
        rows[i, _REACH - len(before):_REACH] = before
        rows[i, _REACH:_REACH + n] = clip[:n]
        after = after[:N_SAMPLES + _REACH - n]
        rows[i, _REACH + n:_REACH + n + len(after)] = after
        lengths.append(n)
    waveform = torch.from_numpy(rows).to(device)
    stft = torch.stft(waveform, N_FFT, HOP_LENGTH, window=torch.hann_window(N_FFT, device=device), center=False,
                      return_complex=True)
    power = stft[..., :N_FRAMES].abs() ** 2
    spectrum = (_filters(n_mels, device) @ power).clamp(min=1e-10).log10()
    peaks = spectrum.amax(dim=(1, 2), keepdim=True)
    features = ((torch.maximum(spectrum, peaks - 8.0) + 4.0) / 4.0).cpu()
    for i, floor in enumerate(floors or ()):
        if floor is not None:
            features[i].clamp_(min=floor)
    if not pad_with_silence:
        for i, n in enumerate(lengths):
            features[i, :, n // HOP_LENGTH:] = 0.0
    return features


# Whisper clamps a log-mel spectrogram (log10 units) at its largest value less 8, then divides by 4: the floor
# lies 2 below the largest feature.
_RANGE = 2.0


def recording_floor(samples: np.ndarray, n_mels: int = 80, windows_at_once: int = 8) -> float | None:
    """The floor of a whole recording's features, as openai-whisper and faster-whisper compute them: their
    log-mel spectrogram of the whole file is clamped at its largest value less 8 (log10 units), where a window's
    own spectrogram is clamped at the window's largest. Given to `log_mel` for windows cut from the recording,
    it keeps a quiet window (a last fraction of a second, a pause) at the file's silence level instead of
    stretching its noise over the whole range; so does a window that starts late in a recording shorter than
    30 s (its last seconds, after a first window ended early). Computed over 30 s pieces, `windows_at_once` at a
    time (memory stays bounded); None for no samples.
    """
    if len(samples) == 0:
        return None
    peak = -np.inf
    step = N_SAMPLES * windows_at_once
    for start in range(0, len(samples), step):
        pieces = [samples[s:s + N_SAMPLES] for s in range(start, min(len(samples), start + step), N_SAMPLES)]
        peak = max(peak, float(log_mel(pieces, n_mels, pad_with_silence=True).amax()))
    return peak - _RANGE
