"""Audio in: any file to float32 mono 16 kHz samples, and Whisper's log-mel features."""

from audio.constants import (
    CHUNK_LENGTH,
    FRAMES_PER_SECOND,
    HOP_LENGTH,
    N_FFT,
    N_FRAMES,
    N_SAMPLES,
    SAMPLE_RATE,
)

# Loaded on first use, so that `audio.constants` costs no torch or transformers import.
_LAZY = {"AudioError": "audio.load", "ChannelError": "audio.load", "duration_seconds": "audio.load",
         "check_audio_head": "audio.load", "load_audio": "audio.load", "load_audio_bytes": "audio.load",
         "log_mel": "audio.features", "pad_or_trim": "audio.features", "recording_floor": "audio.features"}

__all__ = ["CHUNK_LENGTH", "FRAMES_PER_SECOND", "HOP_LENGTH", "N_FFT", "N_FRAMES", "N_SAMPLES", "SAMPLE_RATE",
           "AudioError", "ChannelError", "check_audio_head", "duration_seconds", "load_audio", "load_audio_bytes", "log_mel",
           "pad_or_trim", "recording_floor"]


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'audio' has no attribute {name!r}")
