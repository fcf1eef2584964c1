"""Assistants: what drafts tokens for the model (`choose`), their kinds (`assistants`), and drafts trained for a
model (`distill`)."""
