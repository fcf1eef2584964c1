"""Training a draft model for a Whisper model (`asr distill`): audio in (`data`, `tts`), training (`train`), the whole
run (`pipeline`). The draft's format and loading are `asr.assist.draft_model`."""
