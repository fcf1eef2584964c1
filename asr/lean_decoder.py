"""A lean forward pass over a Whisper decoder's own modules, for drafting.

On a CPU a transformers decoder step spends about as long in Python and cache bookkeeping as in arithmetic
(base: ~19 ms a token in fp32 and still ~12 ms with int8 weights). Drafts need no such generality: this pass
calls the same Linear / LayerNorm modules (fp32, bf16 or dynamically quantised int8), keeps keys and values in
preallocated buffers written by position (gpt-fast's KVCache), and computes the cross-attention keys and values
once per window. Drafts only propose tokens; the model still verifies every one with its own forward pass.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F


@dataclass
class LeanCache:
    """Self-attention keys and values `[layers, B, heads, capacity, head_dim]`, filled up to `length` slots."""

    keys: torch.Tensor
    values: torch.Tensor
    length: int = 0

    def ensure(self, needed: int) -> None:
        """Grows the buffers (doubling) so that `needed` slots fit."""
        capacity = self.keys.shape[3]
        if needed <= capacity:
            return
        extra = max(needed, 2 * capacity) - capacity
        pad = (0, 0, 0, extra)
        self.keys = F.pad(self.keys, pad)
        self.values = F.pad(self.values, pad)


class LeanWhisperDecoderAdapter:
    """A `ModelAdapter` over a Whisper decoder's modules with static buffers (see the module docstring)."""

    def __init__(self, model: torch.nn.Module, encoder_output: torch.Tensor, capacity: int = 256) -> None:
        decoder = model.get_decoder()
        self.layers = list(decoder.layers)
        self.embed_tokens = decoder.embed_tokens
        self.embed_positions = decoder.embed_positions.weight
        self.layer_norm = decoder.layer_norm
        self.proj_out = model.get_output_embeddings()
        config = model.config
        self.heads = config.decoder_attention_heads
        self.head_dim = config.d_model // self.heads
        self.vocab_size = int(config.vocab_size)
        self.max_length = int(config.max_target_positions)
        self.device = encoder_output.device
        self.dtype = self.embed_positions.dtype
        self.capacity = capacity
        self.cross = [self._cross_kv(layer, encoder_output.to(self.dtype)) for layer in self.layers]

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        """`[B, T, d]` -> `[B, heads, T, head_dim]`."""
        return x.view(x.shape[0], x.shape[1], self.heads, self.head_dim).transpose(1, 2)

    @torch.inference_mode()
    def _cross_kv(self, layer: Any, encoder_output: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Cross-attention keys and values, once per window."""
        attention = layer.encoder_attn
        return self._split(attention.k_proj(encoder_output)), self._split(attention.v_proj(encoder_output))

    def new_cache(self, batch_size: int = 1) -> LeanCache:
        shape = (len(self.layers), batch_size, self.heads, self.capacity, self.head_dim)
        return LeanCache(torch.zeros(shape, dtype=self.dtype, device=self.device),
                         torch.zeros(shape, dtype=self.dtype, device=self.device))

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, cache: LeanCache, num_logits: int,
                attention_mask: torch.Tensor | None = None, position_ids: torch.Tensor | None = None) -> torch.Tensor:
        batch, width = input_ids.shape
        start = cache.length
        cache.ensure(start + width)
        if position_ids is None:
            position_ids = torch.arange(start, start + width, device=self.device).expand(batch, width)
        if attention_mask is None and width > 1:
            slots = torch.arange(start + width, device=self.device)
            attention_mask = (slots[None, :] <= (start + torch.arange(width, device=self.device))[:, None])[None, None]
        x = self.embed_tokens(input_ids) + self.embed_positions[position_ids]
        end = start + width
        for index, layer in enumerate(self.layers):
            attention = layer.self_attn
            h = layer.self_attn_layer_norm(x)
            cache.keys[index, :, :, start:end] = self._split(attention.k_proj(h))
            cache.values[index, :, :, start:end] = self._split(attention.v_proj(h))
            a = F.scaled_dot_product_attention(self._split(attention.q_proj(h)), cache.keys[index, :, :, :end],
                                               cache.values[index, :, :, :end], attn_mask=attention_mask)
            x = x + attention.out_proj(a.transpose(1, 2).reshape(batch, width, -1))
            h = layer.encoder_attn_layer_norm(x)
            keys, values = self.cross[index]
            a = F.scaled_dot_product_attention(self._split(layer.encoder_attn.q_proj(h)), keys, values)
            x = x + layer.encoder_attn.out_proj(a.transpose(1, 2).reshape(batch, width, -1))
            x = x + layer.fc2(layer.activation_fn(layer.fc1(layer.final_layer_norm(x))))
        cache.length = end
        x = self.layer_norm(x[:, width - num_logits:])
        return self.proj_out(x).float()

    def crop(self, cache: LeanCache, length: int) -> None:
        cache.length = min(cache.length, length)

    def select(self, cache: LeanCache, rows: torch.Tensor) -> None:
        cache.keys = cache.keys[:, rows]
        cache.values = cache.values[:, rows]
        self.cross = [(k[rows], v[rows]) for k, v in self.cross]

