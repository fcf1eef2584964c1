"""A bfloat16 encoder's self-attention in one native call, on CPUs with AVX512-BF16 and without AMX
(`csrc/encoder_attention.c`).

There PyTorch's flash attention for bfloat16 runs at about its float32 speed, and attention is about half of a
bfloat16 encoder pass (`base` on an AMD EPYC: 30.5 ms of a layer's ~63; with the kernel 13.2 ms;
docs/precision.md). The kernel does both products with AVX512-BF16's pair dot products, keeping in float32 what
PyTorch's kernel keeps in float32 (the scores, the softmax and the sums) and rounding the probabilities to bfloat16
for the second product as it does.
The results differ from PyTorch's in the last bits (the order of the sums), as much as its own differ from a float32
reference. On AMX CPUs PyTorch's bfloat16 attention already runs on the tiles, and stays.

`use_native_encoder_attention(encoder)` routes a transformers encoder's self-attention here
(`AttentionInterface`, through a copy of the config its attention modules read); a call the kernel does not take
(a mask, another dtype or head size, a causal or cross attention; anything within `reference_kernels()` or
`pytorch_attention()`) goes to transformers' SDPA function unchanged.
"""

from __future__ import annotations

import contextlib
import contextvars
import copy
import functools
from collections.abc import Iterator

import torch

from decoding.kernels import native
from decoding.kernels.products import in_reference_kernels

NAME = "assisted_whisper_bf16_encoder"
HEAD_DIM = 64  # every Whisper model's (d_model / heads); the kernel's registers are laid out for it
_PYTORCH = contextvars.ContextVar("pytorch_encoder_attention", default=False)


@contextlib.contextmanager
def pytorch_attention(on: bool = True) -> Iterator[None]:
    """Within the block, a routed encoder attends through transformers' SDPA function when `on` (comparisons)."""
    token = _PYTORCH.set(on)
    try:
        yield
    finally:
        _PYTORCH.reset(token)


@functools.lru_cache(maxsize=None)
def available() -> bool:
    """Whether the kernel is built here and pays: AVX512-BF16 without AMX tiles."""
    lib = native.library()
    return lib is not None and bool(lib.encoder_attention_available()) and not torch.cpu._is_amx_tile_supported()


def attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scale: float) -> torch.Tensor:
    """softmax(scale * q @ k.T) @ v for `[B, H, L, 64]` bfloat16 queries, keys and values on a CPU, as `[B, L, H,
    64]` bfloat16 (the layout an attention block's output projection reads). `available()` must hold.

    Raises:
        MemoryError: no memory for the keys and values regrouped (two copies of them) or a thread's scores.
    """
    batch, heads, frames, width = query.shape
    query, key, value = (t.contiguous() for t in (query, key, value))
    out = torch.empty(batch, frames, heads, width, dtype=torch.bfloat16)
    status = native.library().encoder_attention(query.data_ptr(), key.data_ptr(), value.data_ptr(), out.data_ptr(),
                                                batch, heads, frames, scale, torch.get_num_threads())
    if status != 0:
        raise MemoryError("no memory for the encoder attention's regrouped keys and values or scores")
    return out


def takes(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask: torch.Tensor | None,
          is_causal: bool) -> bool:
    """Whether `attention` computes this call: unmasked bfloat16 self-attention over 64-wide heads on a CPU."""
    return (attention_mask is None and not is_causal and query.device.type == "cpu"
            and all(t.dtype == torch.bfloat16 and t.dim() == 4 for t in (query, key, value))
            and query.shape == key.shape == value.shape and query.shape[-1] == HEAD_DIM)


def attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                      is_causal: bool | None = None, **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature (`AttentionInterface`): the kernel where it `takes` the call,
    else transformers' SDPA function."""
    causal = bool(is_causal if is_causal is not None else getattr(module, "is_causal", False))
    routed = dropout == 0.0 and not _PYTORCH.get() and not in_reference_kernels()
    if routed and takes(query, key, value, attention_mask, causal):
        return attention(query, key, value, scaling if scaling is not None else query.shape[-1] ** -0.5), None
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                  is_causal=is_causal, **kwargs)


def use_native_encoder_attention(encoder: torch.nn.Module) -> bool:
    """Routes the self-attention of `encoder` (a transformers encoder whose attention modules read `.config`) to the
    kernel where it is `available()` and the encoder computes in bfloat16; returns whether it did."""
    if not available() or next(encoder.parameters()).dtype != torch.bfloat16:
        return False
    from transformers import AttentionInterface

    AttentionInterface.register(NAME, attention_forward)
    modules = [m for m in encoder.modules() if m is not encoder and hasattr(m, "config") and hasattr(m, "q_proj")]
    if not modules:
        return False
    config = copy.copy(modules[0].config)  # the decoder keeps the shared config, and SDPA
    config._attn_implementation = NAME
    for module in modules:
        module.config = config
    return True
