"""Assisted (speculative) generation for any pair of models, through small adapters."""

# Loaded on first use, so that `decoding.schedule` (the command line's choices) imports no torch.
_LAZY = {
    "CausalLMAdapter": "decoding.adapters", "ModelAdapter": "decoding.adapters",
    "causal_lm_adapter": "decoding.causal_lm",
    "AssistantDraft": "decoding.drafts", "Draft": "decoding.drafts", "DraftSource": "decoding.drafts",
    "PromptLookupDraft": "decoding.drafts", "ReferenceDraft": "decoding.drafts",
    "GenerationOptions": "decoding.engine", "GenerationResult": "decoding.engine", "generate": "decoding.engine",
    "LogitsFilter": "decoding.filters", "SamplingOptions": "decoding.filters", "SuppressTokens": "decoding.filters",
    "SCHEDULES": "decoding.schedule", "make_schedule": "decoding.schedule",
    "GenerationStats": "decoding.stats",
}

__all__ = [
    "AssistantDraft",
    "CausalLMAdapter",
    "Draft",
    "DraftSource",
    "GenerationOptions",
    "GenerationResult",
    "GenerationStats",
    "LogitsFilter",
    "ModelAdapter",
    "PromptLookupDraft",
    "ReferenceDraft",
    "SCHEDULES",
    "SamplingOptions",
    "SuppressTokens",
    "causal_lm_adapter",
    "generate",
    "make_schedule",
]


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'decoding' has no attribute {name!r}")
