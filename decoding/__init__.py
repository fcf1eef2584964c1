"""Assisted (speculative) generation for any pair of models, through small adapters."""

from decoding.adapters import CausalLMAdapter, ModelAdapter
from decoding.causal_lm import causal_lm_adapter
from decoding.drafts import AssistantDraft, Draft, DraftSource, PromptLookupDraft
from decoding.engine import GenerationOptions, GenerationResult, generate
from decoding.filters import LogitsFilter, SamplingOptions, SuppressTokens
from decoding.schedule import SCHEDULES, make_schedule
from decoding.stats import GenerationStats

__all__ = [
    "AssistantDraft", "CausalLMAdapter", "Draft", "DraftSource", "GenerationOptions", "GenerationResult",
    "GenerationStats", "LogitsFilter", "ModelAdapter", "PromptLookupDraft", "SCHEDULES", "SamplingOptions",
    "SuppressTokens", "causal_lm_adapter", "generate", "make_schedule",
]
