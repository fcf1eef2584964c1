"""A drafting decoder's step in one native call (`decoding.native`'s `draft_step`).

A draft of two layers runs some fifty small operations a step, and on a CPU each costs more in dispatch than in
arithmetic: base-draft:int8's pass took 1.4 ms in decoding against well under a millisecond of reading its
weights. An assistant's logits need not be its own last bits (the model checks every token it proposes), so its
steps after the prompt can run as one C function over the same weights and cache: the layers, the cache writes
and the final norm, with the cross-attention keys and values read in bfloat16. The prompt pass, the head and
everything else stay as they are.
"""

from __future__ import annotations

import ctypes
from typing import Any

import torch

from asr.models.int8 import Int8Linear
from decoding import native
from decoding.kernels import native_rows_allowed
from decoding.kv_cache import StaticKVCache


def _tensor(t: torch.Tensor | None, keep: list[torch.Tensor]) -> int | None:
    if t is None:
        return None
    keep.append(t)
    return t.data_ptr()


def _linear(module: Any, keep: list[torch.Tensor]) -> native.StepLinear | None:
    """The product's weights as `draft_step` reads them: int8 with float32 scales, or float32; else None."""
    if isinstance(module, Int8Linear):
        if module.scale.dtype != torch.float32 or module.weight.device.type != "cpu":
            return None
        weight, scale, bias = module.weight, module.scale, module.bias
    elif isinstance(module, torch.nn.Linear) and module.weight.dtype == torch.float32:
        weight, scale, bias = module.weight.detach(), None, module.bias
    else:
        return None
    if bias is not None:
        if bias.dtype != torch.float32:
            return None
        bias = bias.detach().contiguous()
    weight = weight.contiguous()
    out_features, in_features = weight.shape
    return native.StepLinear(_tensor(weight, keep), _tensor(scale.contiguous() if scale is not None else None, keep),
                             _tensor(bias, keep), out_features, in_features, native.WEIGHT_KINDS[weight.dtype])


def _fused_qkv(attention: Any, keep: list[torch.Tensor]) -> native.StepLinear | None:
    """The query, key and value projections as one product (the drafting copies fuse them already)."""
    fused = getattr(attention, "qkv_proj", None)
    if fused is not None:
        return _linear(fused, keep)
    q, k, v = attention.q_proj, attention.k_proj, attention.v_proj
    if not all(type(p) is type(q) for p in (k, v)) or isinstance(q, Int8Linear) or q.weight.dtype != torch.float32:
        return None
    joined = torch.nn.Linear(q.in_features, 3 * q.out_features)
    with torch.no_grad():
        joined.weight.copy_(torch.cat([q.weight, k.weight, v.weight]))
        zeros = torch.zeros(q.out_features)
        joined.bias.copy_(torch.cat([q.bias if q.bias is not None else zeros, k.bias if k.bias is not None else zeros,
                                     v.bias if v.bias is not None else zeros]))
    return _linear(joined, keep)


def _norm(norm: Any, keep: list[torch.Tensor]) -> tuple[int, int] | None:
    if norm.weight.dtype != torch.float32 or norm.bias is None:
        return None
    return _tensor(norm.weight.detach().contiguous(), keep), _tensor(norm.bias.detach().contiguous(), keep)


class NativeDraftStep:
    """`step(input_ids, cache, num_logits)`: the final-normed hidden states `[num_logits, d]` of a one-window
    drafting decoder's pass over a few new tokens, its keys and values written into `cache` as the adapter's own
    pass writes them. Build with `for_adapter`."""

    def __init__(self, model: native.StepModel, layers: Any, keep: list[torch.Tensor], frames: int,
                 rows: int) -> None:
        self.model = model
        self.layers = layers  # the ctypes array the model points into
        self.keep = keep  # every tensor a pointer refers to
        self.frames = frames
        self.max_rows = rows
        self.scratch = torch.empty(0)

    @staticmethod
    def for_adapter(adapter: Any, model: torch.nn.Module) -> "NativeDraftStep | None":
        """The native step for `adapter` (a `WhisperDecoderAdapter` over one window of `model`), or None where
        it does not apply: no native kernels (or `onednn_only()`), another device, an offloaded or not-float32
        decoder, a product in another form, an activation other than GELU, head sizes not a multiple of 16."""
        if native.library() is None or not native_rows_allowed() or adapter.device.type != "cpu" \
                or adapter.store is not None or adapter.span is not None or adapter.batch_size != 1 \
                or adapter.dtype != torch.float32 or adapter.kv_dtype != torch.float32 \
                or adapter.head_dim % 16 or adapter.embed_tokens.dtype != torch.float32:
            return None
        config = model.config
        if getattr(config, "activation_function", "gelu") != "gelu":
            return None
        decoder = model.get_decoder()
        keep: list[torch.Tensor] = []
        layers = (native.StepLayer * len(decoder.layers))()
        for index, layer in enumerate(decoder.layers):
            keys, values = adapter.cross[index]
            parts = {
                "norm_self": _norm(layer.self_attn_layer_norm, keep), "qkv": _fused_qkv(layer.self_attn, keep),
                "out": _linear(layer.self_attn.out_proj, keep),
                "norm_cross": _norm(layer.encoder_attn_layer_norm, keep),
                "cross_q": _linear(layer.encoder_attn.q_proj, keep),
                "cross_out": _linear(layer.encoder_attn.out_proj, keep),
                "norm_ffn": _norm(layer.final_layer_norm, keep), "fc1": _linear(layer.fc1, keep),
                "fc2": _linear(layer.fc2, keep),
            }
            if any(part is None for part in parts.values()) or keys.dtype != torch.float32 or not keys.is_contiguous():
                return None
            entry = layers[index]
            for name in ("norm_self", "norm_cross", "norm_ffn"):
                setattr(entry, f"{name}_w", parts[name][0])
                setattr(entry, f"{name}_b", parts[name][1])
            for name in ("qkv", "out", "cross_q", "cross_out", "fc1", "fc2"):
                setattr(entry, name, parts[name])
            # Half the bytes a step reads; a draft does not miss the rounding.
            entry.cross_k = _tensor(keys[0].to(torch.bfloat16).contiguous(), keep)
            entry.cross_v = _tensor(values[0].to(torch.bfloat16).contiguous(), keep)
        final = _norm(decoder.layer_norm, keep)
        if final is None:
            return None
        frames = adapter.cross[0][0].shape[-2]
        step = native.StepModel(
            layers=len(decoder.layers), d=config.d_model, heads=adapter.heads, frames=frames,
            ffn=config.decoder_ffn_dim, capacity=0, eps=adapter.eps,
            layer=ctypes.cast(layers, ctypes.POINTER(native.StepLayer)),
            embed_tokens=_tensor(adapter.embed_tokens.detach().contiguous(), keep),
            embed_positions=_tensor(adapter.embed_positions.detach().contiguous(), keep),
            norm_w=final[0], norm_b=final[1])
        return NativeDraftStep(step, layers, keep, frames, native.MAX_ROWS)

    def applies(self, cache: StaticKVCache, width: int) -> bool:
        """Whether a pass of `width` new tokens over `cache` can run here (one row, contiguous buffers)."""
        return 0 < width <= self.max_rows and cache.keys.shape[1] == 1 and cache.keys.is_contiguous() \
            and cache.values.is_contiguous() and cache.keys.dtype == torch.float32

    def __call__(self, input_ids: torch.Tensor, cache: StaticKVCache, start: int, num_logits: int) -> torch.Tensor:
        width = input_ids.shape[1]
        ids = input_ids.reshape(-1).to(torch.int64).contiguous()
        capacity = cache.keys.shape[3]
        threads = torch.get_num_threads()
        model = self.model
        d = model.d
        needed = width * (6 * d + model.ffn) + threads * max(self.frames, capacity)
        if self.scratch.numel() < needed:
            self.scratch = torch.empty(needed)
        model.capacity = capacity
        out = torch.empty(num_logits, d)
        native.library().draft_step(ctypes.addressof(model), ids.data_ptr(), width, start, cache.keys.data_ptr(),
                                    cache.values.data_ptr(), self.scratch.data_ptr(), out.data_ptr(), num_logits,
                                    threads)
        return out
