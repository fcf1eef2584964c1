"""Distilled drafts: small decoders trained to agree with a Whisper model, to assist it.

`asr.distill.pipeline.distill` (the `asr distill` command) builds one; `asr.distill.student.load_draft` loads
one for drafting. This package's modules import torch; the command module imports only click.
"""
