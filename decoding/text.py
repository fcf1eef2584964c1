"""Assisted generation for causal text language models: loading a pair and generating from a prompt."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch

from decoding.causal_lm import causal_lm_adapter
from decoding.drafts import AssistantDraft, DraftSource, PromptLookupDraft
from decoding.engine import GenerationOptions, GenerationResult, generate
from decoding.universal import CrossTokenizerDraft


@dataclass
class TextModel:
    """A causal LM with its tokenizer."""

    name: str
    model: Any
    tokenizer: Any


def load_text_model(name: str, *, device: str = "cpu", dtype: torch.dtype = torch.float32) -> TextModel:
    """Loads a causal LM and its tokenizer from a local folder or a hub id (safetensors, no remote code).

    Raises:
        ValueError: the model cannot be found or downloaded, or it is not a causal LM.
    """
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    try:
        config = AutoConfig.from_pretrained(name, trust_remote_code=False)
    except (OSError, ValueError) as error:
        raise ValueError(f"cannot load model {name!r}: not a local folder with config.json, and not reachable "
                         f"on the Hub ({_first_line(error)})") from None
    if getattr(config, "is_encoder_decoder", False):
        raise ValueError(f"{name} is an encoder-decoder model ({config.model_type}); `asr generate` takes causal "
                         "LMs — use `asr transcribe` for Whisper")
    try:
        model = AutoModelForCausalLM.from_pretrained(name, dtype=dtype, use_safetensors=True, trust_remote_code=False)
    except ValueError as error:
        raise ValueError(f"{name} is not a causal language model: {_first_line(error)}") from None
    except OSError as error:
        raise ValueError(f"cannot load weights of {name!r}: {_first_line(error)}") from None
    try:
        tokenizer = AutoTokenizer.from_pretrained(name, trust_remote_code=False)
    except (OSError, ValueError) as error:
        raise ValueError(f"{name} has no usable tokenizer: {_first_line(error)}") from None
    return TextModel(name, model.to(device).eval(), tokenizer)


def _first_line(error: Exception) -> str:
    """The first line of an error message (loading errors from transformers run to many lines)."""
    return next((line.strip() for line in str(error).splitlines() if line.strip()), type(error).__name__)


def same_vocabulary(a: Any, b: Any) -> bool:
    """True when two tokenizers give every token string the same id."""
    return a.get_vocab() == b.get_vocab()


def make_draft_source(model: TextModel, assistant: TextModel | None, prompt_lookup: bool) -> DraftSource | None:
    """Chooses how drafts are made for a text model.

    Raises:
        ValueError: both an assistant and prompt lookup, or a pair that cannot be bridged.
    """
    if assistant is not None and prompt_lookup:
        raise ValueError("choose either an assistant model or prompt lookup, not both")
    if prompt_lookup:
        return PromptLookupDraft()
    if assistant is None:
        return None
    adapter = causal_lm_adapter(assistant.model)
    if same_vocabulary(model.tokenizer, assistant.tokenizer):
        return AssistantDraft(adapter, model_vocab_size=model.model.get_output_embeddings().weight.shape[0])
    if model.tokenizer is None or assistant.tokenizer is None:
        raise ValueError("the model and the assistant have different vocabularies and no tokenizers to bridge them")
    return CrossTokenizerDraft(adapter, model.tokenizer, assistant.tokenizer)


def generate_text(model: TextModel, prompt: str, options: GenerationOptions, assistant: TextModel | None = None,
                  prompt_lookup: bool = False) -> tuple[GenerationResult, str]:
    """Continues `prompt` with the model, assisted when an assistant or prompt lookup is given.

    Returns:
        The generation result (tokens exclude the prompt) and the generated text.
    """
    draft = make_draft_source(model, assistant, prompt_lookup)
    prompt_ids = model.tokenizer.encode(prompt)
    if not prompt_ids:
        raise ValueError("the prompt is empty after tokenisation; give some text")
    eos = model.tokenizer.eos_token_id
    if not options.eos_token_ids and eos is not None:
        options = replace(options, eos_token_ids=(eos,))
    adapter = causal_lm_adapter(model.model)
    if options.max_length is None and adapter.max_length:
        options = replace(options, max_length=int(adapter.max_length))
    result = generate(adapter, prompt_ids, options, draft=draft)
    return result, model.tokenizer.decode(result.tokens, skip_special_tokens=True)
