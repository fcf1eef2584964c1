"""Preallocated key/value buffers written by position (gpt-fast's KVCache), croppable and row-selectable."""

from __future__ import annotations

from dataclasses import dataclass, field

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
    # Buffers a gathering `select` let go of, reused by the next one of the same shape (beams).
    spares: dict[str, torch.Tensor] = field(default_factory=dict, repr=False, compare=False)

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
        """Keeps (reorders, repeats) the batch rows `rows`, copying only their filled slots. Rows kept in order (a
        batch whose windows finish) move forward within the buffers; any other choice (beams) is gathered into the
        buffers the last such choice left, where they fit. A fresh buffer's pages cost more than the copy: a beam
        reorders its rows at most steps, and a batch sheds rows as its windows end (on a GPU, whose allocator keeps
        freed memory, a batch's rows are gathered too: one copy, not one per layer and row). Slots past `length` keep
        whatever finite values they held (masked wherever they are read)."""
        order = [int(r) for r in rows.tolist()]
        in_order = all(a < b for a, b in zip(order, order[1:]))
        for name in ("keys", "values"):
            old = getattr(self, name)
            layers, batch, shape = old.shape[0], old.shape[1], (old.shape[0], len(order), *old.shape[2:])
            if in_order and old.is_contiguous() and old.device.type == "cpu":
                # Row r of layer l moves from chunk l * batch + r to l * len(order) + i, never later: walking
                # forward, no chunk is written before it is read.
                kept = old.view(-1)[:old[0, 0].numel() * layers * len(order)].view(shape)
                for layer in range(layers):
                    for i, r in enumerate(order):
                        if layer * batch + r != layer * len(order) + i:
                            kept[layer, i, :, :self.length] = old[layer, r, :, :self.length]
            else:
                spare = self.spares.pop(name, None)
                kept = spare if spare is not None and spare.shape == shape else old.new_zeros(shape)
                kept[:, :, :, :self.length] = old[:, rows.to(old.device), :, :self.length]
                self.spares[name] = old
            setattr(self, name, kept)


def causal_mask(start: int, width: int, device: torch.device, slots: int | None = None) -> torch.Tensor:
    """`[1, 1, width, slots]` boolean (`slots` default `start + width`): new token `i` sees every cached slot and
    the new tokens up to `i`."""
    slots = torch.arange(start + width if slots is None else slots, device=device)
    return (slots[None, :] <= (start + torch.arange(width, device=device))[:, None])[None, None]
