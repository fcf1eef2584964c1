"""Distilled drafts: small decoders trained to agree with a Whisper model, to assist it.

`asr.assist.distill.pipeline.distill` (the `asr distill` command) builds one; `asr.assist.distill.student.load_draft` loads
one for drafting. This package's modules import torch; the command module imports only click.
"""
