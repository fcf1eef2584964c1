"""Whisper speech recognition with assisted decoding: the large model's words, faster.

    from asr import load_model, transcribe
    bundle = load_model("base")
    print(transcribe(bundle, "speech.flac").text)
"""

__all__ = ["SubtitleOptions", "TranscribeOptions", "load_model", "make_assistant", "transcribe", "transcribe_segments"]


def __getattr__(name: str):
    # Lazy, so `asr --help` answers without importing torch and transformers.
    if name == "load_model":
        from asr.models.registry import load_model

        return load_model
    if name == "transcribe":
        from asr.transcribe import transcribe

        return transcribe
    if name == "transcribe_segments":  # segments as they are decoded
        from asr.live import transcribe_segments

        return transcribe_segments
    if name == "TranscribeOptions":
        from asr.options import TranscribeOptions

        return TranscribeOptions
    if name == "SubtitleOptions":
        from asr.writers import SubtitleOptions

        return SubtitleOptions
    if name == "make_assistant":
        from asr.assist.choose import make_assistant

        return make_assistant
    raise AttributeError(name)
