"""Audio in: any file to float32 mono 16 kHz samples, and Whisper's log-mel features."""

from audio.features import (
    CHUNK_LENGTH,
    FRAMES_PER_SECOND,
    HOP_LENGTH,
    N_FFT,
    N_FRAMES,
    N_SAMPLES,
    log_mel,
    pad_or_trim,
)
from audio.load import SAMPLE_RATE, AudioError, duration_seconds, load_audio

__all__ = [
    "CHUNK_LENGTH",
    "FRAMES_PER_SECOND",
    "HOP_LENGTH",
    "N_FFT",
    "N_FRAMES",
    "N_SAMPLES",
    "SAMPLE_RATE",
    "AudioError",
    "duration_seconds",
    "load_audio",
    "log_mel",
    "pad_or_trim",
]
