"""Whisper speech recognition with assisted decoding: the large model's words, faster.

    from asr import load_model, transcribe
    bundle = load_model("base")
    print(transcribe(bundle, "speech.flac").text)
"""

# Loaded on first use, so that `asr --help` answers without importing torch and transformers.
_PUBLIC = {
    "load_model": "asr.models.registry",
    "make_assistant": "asr.assist.choose",
    "load_pair": "asr.assist.choose",  # a model and its assistant, from their names
    "transcribe": "asr.transcription",
    "transcribe_segments": "asr.transcription",  # segments as they are decoded
    "transcribe_many": "asr.transcription",  # several audios, their windows decoded together
    "Transcriber": "asr.transcription",  # a model, its assistant and options checked once, for many audios
    "TranscribeOptions": "asr.options",
    "SubtitleOptions": "asr.writers",
}

__all__ = ["SubtitleOptions", "TranscribeOptions", "Transcriber", "load_model", "load_pair", "make_assistant",
           "transcribe", "transcribe_many", "transcribe_segments"]


def __getattr__(name: str):
    if name in _PUBLIC:
        import importlib

        return getattr(importlib.import_module(_PUBLIC[name]), name)
    raise AttributeError(f"module 'asr' has no attribute {name!r}")
