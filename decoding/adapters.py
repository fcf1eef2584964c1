"""Adapters: the engine's only view of a model.

An adapter scores tokens given an explicit cache. The engine owns the cache object and its length; the adapter
appends to it on `forward` and cuts it back on `crop`. Nothing else about the model leaks into `decoding/`.
"""

from __future__ import annotations

import inspect
from typing import Any, Protocol

import torch


class ModelAdapter(Protocol):
    """A model that scores tokens given an explicit KV cache."""

    vocab_size: int
    device: torch.device

    def new_cache(self, batch_size: int = 1) -> Any:
        """Returns an empty cache for `batch_size` sequences."""

    def forward(self, input_ids: torch.Tensor, cache: Any, num_logits: int,
                attention_mask: torch.Tensor | None = None, position_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Appends `input_ids` to the cache and scores the last positions.

        Args:
            input_ids: `[B, T]` token ids that follow what the cache holds.
            cache: the cache from `new_cache`, extended in place.
            num_logits: how many of the last positions need logits (0 for none).
            attention_mask: `[B, 1, T, S + T]` boolean, True where a token may attend (None: plain causal).
            position_ids: `[B, T]` positions of the new tokens (None: follow the cache length).

        Returns:
            `[B, num_logits, V]` float logits; logits `j` predict the token after input position
            `T - num_logits + j`.
        """

    def crop(self, cache: Any, length: int) -> None:
        """Cuts the cache back to its first `length` slots."""

    def select(self, cache: Any, rows: torch.Tensor) -> None:
        """Keeps only the given batch rows of the cache (and of any per-row state); a row may be given twice.

        An adapter with per-row state may also have `select_cache(cache, rows)`: the same for the cache alone,
        for reorders that leave every row's state as it is (beam search within a prompt's beams).
        """


class CausalLMAdapter:
    """Any transformers causal LM (`AutoModelForCausalLM`) with a croppable `DynamicCache`."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.check(model)
        self.model = model
        self.vocab_size = int(model.get_output_embeddings().weight.shape[0])
        self.device = next(model.parameters()).device
        self.max_length = max_positions(model.config)
        self.dtype = next(model.parameters()).dtype
        # transformers renamed `past_key_values` to `cache` in 5.2x; older 5.x releases know only the first.
        parameters = inspect.signature(model.forward).parameters
        self._cache_argument = "cache" if "cache" in parameters else "past_key_values"

    @staticmethod
    def check(model: torch.nn.Module) -> None:
        """Raises ValueError unless `model` is a causal LM with a language-model head."""
        if getattr(model.config, "is_encoder_decoder", False):
            raise ValueError(
                f"{type(model).__name__} is an encoder-decoder model; pass a causal LM "
                "(AutoModelForCausalLM), or use `asr transcribe` for Whisper"
            )
        if not hasattr(model, "get_output_embeddings") or model.get_output_embeddings() is None:
            raise ValueError(f"{type(model).__name__} has no language-model head; load it with AutoModelForCausalLM")

    def new_cache(self, batch_size: int = 1) -> Any:
        from transformers import DynamicCache

        return DynamicCache(config=self.model.config)

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, cache: Any, num_logits: int,
                attention_mask: torch.Tensor | None = None, position_ids: torch.Tensor | None = None) -> torch.Tensor:
        # logits_to_keep=0 means "all" to transformers: keep one and drop it when none is wanted.
        out = self.model(input_ids=input_ids, **{self._cache_argument: cache}, use_cache=True,
                         logits_to_keep=max(num_logits, 1),
                         attention_mask=additive_mask(attention_mask, self.dtype), position_ids=position_ids)
        return out.logits[:, out.logits.shape[1] - num_logits:].float()

    def crop(self, cache: Any, length: int) -> None:
        crop_cache(cache, length)

    def select(self, cache: Any, rows: torch.Tensor) -> None:
        cache.batch_select_indices(rows)


def max_positions(config) -> int | None:
    """The longest sequence a causal LM's config allows (GPT-2 names it `n_positions`), or None."""
    return getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)


def additive_mask(mask: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """A boolean attention mask as the additive float mask that eager and SDPA attention both take."""
    if mask is None:
        return None
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, torch.finfo(dtype).min)


def crop_cache(cache: Any, length: int) -> None:
    """Cuts a transformers cache back to `length` tokens (transformers 5 takes the number to remove, negated)."""
    extra = cache.get_seq_length() - length
    if extra > 0:
        cache.crop(-extra)
