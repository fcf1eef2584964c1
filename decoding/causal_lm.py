"""A direct forward pass for GPT-2- and Llama-shaped causal LMs, with preallocated key/value buffers.

transformers' forward adds Python work to every step (module calls, mask and cache bookkeeping): a sizeable
share of a small model's step on a CPU, and most of a step on a GPU, where small steps are bound by kernel
launches. This pass calls the model's own weights through the same kernels in the same order
as transformers' SDPA attention path, so its logits are transformers' bit for bit (tests/test_causal_lm.py),
but keeps keys and values in `StaticKVCache` buffers and calls each layer's functions directly. Other
architectures, and models loaded with another attention implementation, use `CausalLMAdapter`.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn.functional as F

from decoding.adapters import CausalLMAdapter, ModelAdapter, max_positions
from decoding.kernels.products import OneDnnLinear, linear
from decoding.kv_cache import StaticKVCache, causal_mask

Fn = Callable[[torch.Tensor], torch.Tensor]
LLAMA_SHAPED = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM")


def causal_lm_adapter(model: torch.nn.Module) -> ModelAdapter:
    """The fastest exact adapter for a transformers causal LM: the direct pass where the architecture is known
    (GPT-2, Llama, Mistral and Qwen2 without sliding windows), else transformers' own forward."""
    CausalLMAdapter.check(model)
    reason = direct_pass_unsupported(model)
    if reason is None:
        return GPT2Pass(model) if type(model).__name__ == "GPT2LMHeadModel" else LlamaPass(model)
    return CausalLMAdapter(model)


def direct_pass_unsupported(model: torch.nn.Module) -> str | None:
    """Why the direct pass cannot stand in for `model`'s own forward (None: it can)."""
    config = model.config
    name = type(model).__name__
    if getattr(config, "_attn_implementation", None) != "sdpa":
        return f"attention implementation {getattr(config, '_attn_implementation', None)!r} (the pass mirrors sdpa)"
    if name == "GPT2LMHeadModel":
        if config.add_cross_attention:
            return "GPT-2 with cross-attention"
        return None
    if name not in LLAMA_SHAPED:
        return f"{name} is not a GPT-2- or Llama-shaped model"
    if any(kind != "full_attention" for kind in getattr(config, "layer_types", None) or ()):
        return "sliding-window layers"
    window = getattr(config, "sliding_window", None)
    if window is not None and window < (config.max_position_embeddings or 0):
        return "a sliding window shorter than the model's length"
    return None


class _DirectPass:
    """What both architectures share: the cache, the mask, the head, and the adapter protocol."""

    def __init__(self, model: torch.nn.Module, layers: int, kv_heads: int, head_dim: int, capacity: int) -> None:
        head = model.get_output_embeddings()
        self.lm_head = linear_fn(head)
        self.vocab_size = int(head.weight.shape[0])
        self.device = head.weight.device
        self.dtype = head.weight.dtype
        self.max_length = max_positions(model.config)
        self._cache_shape = (layers, kv_heads, head_dim)
        self.capacity = capacity

    def new_cache(self, batch_size: int = 1) -> StaticKVCache:
        layers, heads, head_dim = self._cache_shape
        return StaticKVCache.empty(layers, batch_size, heads, head_dim, self.capacity, self.dtype, self.device)

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, cache: StaticKVCache, num_logits: int,
                attention_mask: torch.Tensor | None = None, position_ids: torch.Tensor | None = None) -> torch.Tensor:
        batch, width = input_ids.shape
        start = cache.length
        cache.ensure(start + width)
        if position_ids is None:
            position_ids = torch.arange(start, start + width, device=self.device).expand(batch, width)
        # transformers' SDPA path: no mask for one token or a prefill of an empty cache (SDPA's is_causal),
        # an explicit boolean mask for several tokens after cached ones.
        is_causal = attention_mask is None and width > 1 and start == 0
        if attention_mask is None and width > 1 and start > 0:
            attention_mask = causal_mask(start, width, self.device)
        x = self._layers(input_ids, position_ids, cache, start, attention_mask, is_causal)
        cache.length = start + width
        return self.lm_head(self.norm(x[:, width - num_logits:])).float()

    def crop(self, cache: StaticKVCache, length: int) -> None:
        cache.crop(length)

    def select(self, cache: StaticKVCache, rows: torch.Tensor) -> None:
        cache.select(rows)

    def _layers(self, input_ids: torch.Tensor, position_ids: torch.Tensor, cache: StaticKVCache, start: int,
                mask: torch.Tensor | None, is_causal: bool) -> torch.Tensor:
        raise NotImplementedError


class GPT2Pass(_DirectPass):
    """`GPT2LMHeadModel`: learned positions, fused Conv1D projections, LayerNorm, GELU MLP."""

    def __init__(self, model: torch.nn.Module, capacity: int = 256) -> None:
        body = model.transformer
        config = model.config
        self.heads = config.n_head
        self.head_dim = config.n_embd // self.heads
        super().__init__(model, len(body.h), self.heads, self.head_dim, capacity)
        self.wte, self.wpe = body.wte.weight, body.wpe.weight
        self.norm = layer_norm_fn(body.ln_f)
        self.blocks = [
            (layer_norm_fn(b.ln_1), _conv1d(b.attn.c_attn), _conv1d(b.attn.c_proj), self._scaling(config, index),
             layer_norm_fn(b.ln_2), _conv1d(b.mlp.c_fc), b.mlp.act.forward, _conv1d(b.mlp.c_proj))
            for index, b in enumerate(body.h)
        ]

    def _scaling(self, config: Any, index: int) -> float:
        """GPT-2's attention scale: 1/sqrt(head_dim) unless turned off, and 1/(layer + 1) where asked."""
        scaling = self.head_dim ** -0.5 if config.scale_attn_weights else 1.0
        return scaling / float(index + 1) if config.scale_attn_by_inverse_layer_idx else scaling

    def _layers(self, input_ids, position_ids, cache, start, mask, is_causal):
        batch, width = input_ids.shape
        x = F.embedding(input_ids, self.wte) + F.embedding(position_ids, self.wpe)
        d = x.shape[-1]
        shape = (batch, width, self.heads, self.head_dim)
        for index, (ln_1, c_attn, c_proj, scaling, ln_2, c_fc, act, mlp_proj) in enumerate(self.blocks):
            q, k, v = c_attn(ln_1(x)).split(d, dim=2)
            k, v = cache.write(index, start, k.view(shape).transpose(1, 2), v.view(shape).transpose(1, 2))
            a = F.scaled_dot_product_attention(q.view(shape).transpose(1, 2), k, v, attn_mask=mask,
                                               is_causal=is_causal, scale=scaling)
            x = c_proj(a.transpose(1, 2).reshape(batch, width, d)) + x
            x = x + mlp_proj(act(c_fc(ln_2(x))))
        return x


class LlamaPass(_DirectPass):
    """Llama-shaped models (Llama, Mistral, Qwen2): rotary positions, grouped-query attention, RMSNorm, gated MLP."""

    def __init__(self, model: torch.nn.Module, capacity: int = 256) -> None:
        body = model.model
        config = model.config
        attention = body.layers[0].self_attn
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        self.head_dim = attention.head_dim
        super().__init__(model, len(body.layers), self.kv_heads, self.head_dim, capacity)
        self.embed = body.embed_tokens.weight
        self.rotary = body.rotary_emb
        self.norm = _rms_norm(body.norm)
        self.blocks = [
            (_rms_norm(layer.input_layernorm), linear_fn(layer.self_attn.q_proj), linear_fn(layer.self_attn.k_proj),
             linear_fn(layer.self_attn.v_proj), linear_fn(layer.self_attn.o_proj), layer.self_attn.scaling,
             _rms_norm(layer.post_attention_layernorm), linear_fn(layer.mlp.gate_proj), linear_fn(layer.mlp.up_proj),
             layer.mlp.act_fn.forward, linear_fn(layer.mlp.down_proj))
            for layer in body.layers
        ]

    def _layers(self, input_ids, position_ids, cache, start, mask, is_causal):
        batch, width = input_ids.shape
        x = F.embedding(input_ids, self.embed)
        cos, sin = self.rotary(x, position_ids)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        q_shape = (batch, width, self.heads, self.head_dim)
        kv_shape = (batch, width, self.kv_heads, self.head_dim)
        groups = self.heads // self.kv_heads
        # As transformers: SDPA's own grouped-query attention without a mask, repeated key/value heads with one.
        gqa = {"enable_gqa": True} if groups > 1 and mask is None else {}
        for index, (norm_1, q_proj, k_proj, v_proj, o_proj, scaling, norm_2, gate, up, act, down) in enumerate(
                self.blocks):
            h = norm_1(x)
            q = q_proj(h).view(q_shape).transpose(1, 2)
            k = k_proj(h).view(kv_shape).transpose(1, 2)
            v = v_proj(h).view(kv_shape).transpose(1, 2)
            q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
            k, v = cache.write(index, start, k, v)
            if groups > 1 and mask is not None:
                k, v = _repeat_kv(k, groups), _repeat_kv(v, groups)
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal, scale=scaling, **gqa)
            x = x + o_proj(a.transpose(1, 2).reshape(batch, width, -1))
            h = norm_2(x)
            x = x + down(act(gate(h)) * up(h))
        return x


def linear_fn(module: torch.nn.Module) -> Fn:
    """`module`'s forward without nn.Module's call machinery (`decoding.kernels.products.linear` for a plain Linear; the
    module's own forward for anything else, e.g. an int8 linear)."""
    if type(module) in (torch.nn.Linear, OneDnnLinear):
        return linear(module.weight, module.bias, getattr(module, "packed", None))
    return module.forward


def _conv1d(module: Any) -> Fn:
    """transformers' GPT-2 `Conv1D` (a transposed linear layer), through the same addmm it calls."""
    weight, bias = module.weight, module.bias
    out_features = weight.shape[1]
    return lambda x: torch.addmm(bias, x.view(-1, x.shape[-1]), weight).view(*x.shape[:-1], out_features)


def layer_norm_fn(module: torch.nn.LayerNorm) -> Fn:
    """`module`'s forward as a direct F.layer_norm call."""
    shape, weight, bias, eps = module.normalized_shape, module.weight, module.bias, module.eps
    return lambda x: F.layer_norm(x, shape, weight, bias, eps)


def _rms_norm(module: Any) -> Fn:
    """Llama's RMSNorm: the variance in float32, the result scaled in the input's dtype."""
    weight, eps = module.weight, module.variance_epsilon

    def norm(x: torch.Tensor) -> torch.Tensor:
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
        return weight * h.to(x.dtype)
    return norm


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _repeat_kv(x: torch.Tensor, groups: int) -> torch.Tensor:
    """`[B, kv_heads, S, D]` -> `[B, kv_heads * groups, S, D]`, each key/value head serving `groups` query heads."""
    batch, heads, length, dim = x.shape
    return x[:, :, None].expand(batch, heads, groups, length, dim).reshape(batch, heads * groups, length, dim)
