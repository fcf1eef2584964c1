"""Preallocated key/value buffers written by position (gpt-fast's KVCache), croppable and row-selectable."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class StaticKVCache:
    """Self-attention keys and values `[layers, B, kv_heads, capacity, head_dim]`, filled up to `length` slots.

    Cropping is setting `length`; appending writes slots `length:length + T` in place, so neither a rejected
    draft nor a new token copies what the cache already holds (transformers' DynamicCache concatenates).
    """

    keys: torch.Tensor
    values: torch.Tensor
    length: int = 0

    @classmethod
    def empty(cls, layers: int, batch_size: int, heads: int, head_dim: int, capacity: int, dtype: torch.dtype,
              device: torch.device) -> "StaticKVCache":
        shape = (layers, batch_size, heads, capacity, head_dim)
        return cls(torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))

    def ensure(self, needed: int) -> None:
        """Grows the buffers (doubling) so that `needed` slots fit, copying only the filled slots."""
        capacity = self.keys.shape[3]
        if needed <= capacity:
            return
        shape = list(self.keys.shape)
        shape[3] = max(needed, 2 * capacity)
        for name in ("keys", "values"):
            old = getattr(self, name)
            grown = old.new_zeros(shape)
            grown[:, :, :, :self.length] = old[:, :, :, :self.length]
            setattr(self, name, grown)

    def write(self, layer: int, start: int, keys: torch.Tensor,
              values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Stores `[B, kv_heads, T, head_dim]` keys and values at slots `start:start + T` of `layer`; returns the
        layer's keys and values up to the end of what was written."""
        end = start + keys.shape[2]
        self.keys[layer, :, :, start:end] = keys
        self.values[layer, :, :, start:end] = values
        return self.keys[layer, :, :, :end], self.values[layer, :, :, :end]

    def write_at(self, layer: int, slots: torch.Tensor, keys: torch.Tensor,
                 values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Stores `[B, kv_heads, T, head_dim]` keys and values at the `[T]` slots of `layer` that a tensor holds
        (no host value: a CUDA graph replays it for any slots); returns the layer's buffers, every slot."""
        keys_out, values_out = self.keys[layer], self.values[layer]
        keys_out.index_copy_(2, slots, keys.to(keys_out.dtype))
        values_out.index_copy_(2, slots, values.to(values_out.dtype))
        return keys_out, values_out

    def crop(self, length: int) -> None:
        self.length = min(self.length, length)

    def select(self, rows: torch.Tensor) -> None:
        self.keys = self.keys[:, rows]
        self.values = self.values[:, rows]


def causal_mask(start: int, width: int, device: torch.device, slots: int | None = None) -> torch.Tensor:
    """`[1, 1, width, slots]` boolean (`slots` default `start + width`): new token `i` sees every cached slot and
    the new tokens up to `i`."""
    slots = torch.arange(start + width if slots is None else slots, device=device)
    return (slots[None, :] <= (start + torch.arange(width, device=device))[:, None])[None, None]
