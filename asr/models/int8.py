"""A model's Linear layers quantised to weight-only int8 and back: the `--dtype int8` model's and the int8 drafts'.

The layer itself, its kernels and its precision are `decoding.kernels.int8.Int8Linear`'s; here are the functions
that swap it in and out over a model's modules (`asr.models.precision`, `asr.assist.assistants`).
"""

from __future__ import annotations

import torch

from decoding.kernels.int8 import Int8Linear


def dequantize_linears(module: torch.nn.Module) -> torch.nn.Module:
    """Replaces every `Int8Linear` inside `module` (in place) with its `to_linear()`; returns `module`."""
    for name, child in list(module.named_children()):
        if isinstance(child, Int8Linear):
            setattr(module, name, child.to_linear())
        else:
            dequantize_linears(child)
    return module


def quantize_linears(module: torch.nn.Module, dtype: torch.dtype = torch.bfloat16) -> torch.nn.Module:
    """Replaces every `nn.Linear` inside `module` (in place) with an `Int8Linear`; returns `module`."""
    for name, child in list(module.named_children()):
        if isinstance(child, torch.nn.Linear):
            setattr(module, name, Int8Linear(child, dtype))
        else:
            quantize_linears(child, dtype)
    return module


def keep_dequantized_within(module: torch.nn.Module, limit: int) -> bool:
    """Makes every `Int8Linear` inside `module` keep its bfloat16 copy (`Int8Linear.keep_dequantized`) where their
    int8 weights hold at most `limit` bytes (the copies twice that); returns whether they do."""
    linears = [m for m in module.modules() if isinstance(m, Int8Linear)]
    if sum(m.weight.numel() for m in linears) > limit:
        return False
    for linear in linears:
        linear.keep_dequantized()
    return True
