"""Assistants: what drafts tokens for the model (`choose`), their kinds (`assistants`), and the format of drafts
trained for a model (`draft`; `asr.distill` trains them, `drafts/` holds the shipped ones)."""
