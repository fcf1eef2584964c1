"""A decoder's step of a few tokens in one native call (`decoding.kernels.native`'s `decoder_step`).

A decoder step runs some fifty small operations, and on a CPU each costs more in dispatch than in arithmetic:
base-draft:int8's pass took 1.4 ms in decoding against well under a millisecond of reading its weights, and base's
step ~1 ms more than its products and attention. After the prompt, a float32 (or int8-weight) decoder's steps of
one window can run as one C function over the same weights and cache: the layers, the cache writes and the final
norm, every row computed on its own in one fixed order (a check of drafts gives each row a one-token step's bits).
A drafting copy reads its cross-attention keys and values in bfloat16 (its logits need not be its own last bits:
the model checks every token it proposes); a float32 model keeps them in float32, the int8 model, whose keys and
values are bfloat16 values, reads them so. The int8 model (`--dtype int8`, whose
token table is bfloat16, widened as it is read) takes every pass after its prompt through it, whatever its width,
so that each row has one step's bits however many drafts are checked with it. A batch of windows' one-token
steps run as one call too (`rows_step`): the weights read once for all rows, each row its window's own step's
bits. A packed float32 model's prompt pass runs here too (below); the head and every other pass stay as they
are.

A decoder of at most `PACK_LIMIT` bytes of layer weights keeps a packed copy of them (`native.pack`, made once
per model), which the step's products read instead: blocks of 64 outputs that a tile of 6 rows reads together,
1.3-1.6x as fast for checks of drafts (their whole passes 1.04-1.2x), a one-token step's no slower
(docs/precision.md). A row's bits then do not depend on the row count either, so a check still gives each row a
one-token step's bits.
"""

from __future__ import annotations

import copy
import ctypes
import weakref
from typing import Any

import torch

from decoding.kernels import native
from decoding.kernels.int8 import Int8Linear
from decoding.kernels.products import MANY_ROWS, native_rows_allowed
from decoding.kv_cache import StaticKVCache

# Up to this many new tokens a float32 decoder's pass after its prompt is one native call where its weights are not
# packed (larger than `PACK_LIMIT`): a step, and a check of up to 23 drafts, each row with a one-token step's bits.
# `base` on the AMD EPYC, 2 threads, screened head, ms a pass against the layers over oneDNN, before the packed
# products: 8 tokens 13.1 / 18.4, 17 tokens 20.5 / 23.4, 24 tokens 27.0 / 29.2, 32 tokens (oneDNN in both) 34.4 /
# 34.1 (docs/figures/native-widths.md). A packed decoder's passes take it at every width (`PACKED_ROWS`).
STEP_ROWS = 24

# The most bytes of layer weights whose packed copies (`native.pack`) a decoder's step keeps: tiny to small in
# float32 (base +88 MB), up to medium in int8. Over them its products read each weight row by row, as every step
# did before: checks of 8-24 rows 1.3-1.6x slower in their products (docs/precision.md).
PACK_LIMIT = 512 * 2**20

# Up to this many new tokens a packed float32 decoder's pass is one native call, its prompt pass included (the most a
# window's prompt and drafts take: 448 positions): over the packed weights it beats the layers over oneDNN at every
# width measured. `base`, 2 threads, ms a pass, layers / native, on the AMD EPYC: checks (screened head) of 31 drafts
# 35.3 / 24.3, of 63 drafts 53.1 / 42.2; prompts of 20 tokens 22.8 / 13.2, of 48 35.3 / 23.4, of 224 107.3 / 91.7
# (docs/figures/native-prompt.md); on the Intel Xeon the layers of a 64-token pass, no head, 26.3 / 25.4.
PACKED_ROWS = MANY_ROWS - 1


def int8_prompts_here() -> bool:
    """Whether the int8 model's prompt passes run in its step rather than over its weights in bfloat16: on CPUs
    without AMX. The AMD EPYC (AVX512-BF16), `base`, 2 threads, ms a prompt pass, bfloat16 / step: 20 tokens 22.5 /
    10.1, 48 28.7 / 19.9, 100 45.2 / 39.8, 224 88.0 / 87.9; the same text on the 65 English WER recordings and
    the 51 in other languages (docs/precision.md). AMX's bfloat16 tiles, where the int8 model's prompts and
    products of many rows gain most, were not measured against it."""
    return not torch.cpu._is_amx_tile_supported()


# Each module's packed weights (a fused projection's three), made once and kept as long as the module: `for_adapter`
# runs for every window. Keyed by the module, so a copy of it (a drafting copy's) never reads another's.
_PACKED: "weakref.WeakKeyDictionary[torch.nn.Module, dict[int, torch.Tensor]]" = weakref.WeakKeyDictionary()


def _packed(module: torch.nn.Module, part: int, weight: torch.Tensor) -> torch.Tensor:
    """`weight` (part `part` of `module`'s weight) packed as `packed_products` reads it, made at the first call."""
    parts = _PACKED.setdefault(module, {})
    if part not in parts:
        parts[part] = native.pack(weight)
    return parts[part]


def _tensor(t: torch.Tensor | None, keep: list[torch.Tensor]) -> int | None:
    if t is None:
        return None
    keep.append(t)
    return t.data_ptr()


def _product(module: torch.nn.Module, part: int, weight: torch.Tensor, scale: torch.Tensor | None,
             bias: torch.Tensor | None, keep: list[torch.Tensor], pack: bool) -> native.StepLinear | None:
    if weight.device.type != "cpu" or weight.dtype not in native.WEIGHT_KINDS or \
            any(t is not None and t.dtype != torch.float32 for t in (scale, bias)):
        return None
    weight = weight.detach().contiguous()
    out_features, in_features = weight.shape
    return native.StepLinear(_tensor(weight, keep), _tensor(scale.contiguous() if scale is not None else None, keep),
                             _tensor(bias.detach().contiguous() if bias is not None else None, keep), out_features,
                             in_features, native.WEIGHT_KINDS[weight.dtype],
                             _tensor(_packed(module, part, weight), keep) if pack else None)


def _stepped(module: Any) -> bool:
    """Whether `decoder_step` reads `module`'s product: int8 with float32 scales, or float32."""
    return isinstance(module, Int8Linear) or isinstance(module, torch.nn.Linear) and \
        module.weight.dtype == torch.float32


def _linear(module: Any, keep: list[torch.Tensor], pack: bool) -> native.StepLinear | None:
    """The product's weights as `decoder_step` reads them (`_stepped`), packed too where `pack`; else None."""
    if not _stepped(module):
        return None
    scale = module.scale if isinstance(module, Int8Linear) else None
    return _product(module, 0, module.weight, scale, module.bias, keep, pack)


def _projections(attention: Any, keep: list[torch.Tensor], pack: bool) -> list[native.StepLinear | None]:
    """The query, key and value products; a drafting copy's fused projection as three slices of its rows (views,
    no copies)."""
    fused = getattr(attention, "qkv_proj", None)
    if fused is None:
        return [_linear(attention.q_proj, keep, pack), _linear(attention.k_proj, keep, pack),
                _linear(attention.v_proj, keep, pack)]
    if not isinstance(fused, (Int8Linear, torch.nn.Linear)) or fused.weight.dtype not in (torch.float32, torch.int8):
        return [None] * 3
    d = fused.weight.shape[0] // 3
    scale = fused.scale if isinstance(fused, Int8Linear) else None
    return [_product(fused, i, fused.weight[i * d:(i + 1) * d], scale[i * d:(i + 1) * d] if scale is not None else None,
                     fused.bias[i * d:(i + 1) * d] if fused.bias is not None else None, keep, pack) for i in range(3)]


def _packs(decoder: torch.nn.Module) -> bool:
    """Whether a decoder's step keeps packed copies of its layers' weights: at most `PACK_LIMIT` bytes of them."""
    return sum(m.weight.numel() * m.weight.element_size() for m in decoder.layers.modules() if _stepped(m)) \
        <= PACK_LIMIT


def _tiles(keys: torch.Tensor) -> torch.Tensor:
    """`[heads, frames, head_dim]` cross-attention keys in `decoder_step`'s layout: tiles of 16 frames, each
    `head_dim` rows of 16 (`[heads, tiles, head_dim, 16]`), zero past the last frame."""
    heads, frames, head_dim = keys.shape
    whole = frames // 16 * 16
    # Written in place, not padded first: one copy of the keys, not two (every window; base's six layers on the AMD
    # EPYC 2.3-2.9 -> 1.6 ms).
    tiles = torch.empty(heads, -(-frames // 16), head_dim, 16, dtype=keys.dtype)
    tiles[:, :whole // 16] = keys[:, :whole].view(heads, -1, 16, head_dim).transpose(2, 3)
    if whole < frames:
        tiles[:, -1] = 0
        tiles[:, -1, :, :frames - whole] = keys[:, whole:].transpose(1, 2)
    return tiles


def _norm(norm: Any, keep: list[torch.Tensor]) -> tuple[int, int] | None:
    if norm.weight.dtype != torch.float32 or norm.bias is None:
        return None
    return _tensor(norm.weight.detach().contiguous(), keep), _tensor(norm.bias.detach().contiguous(), keep)


class NativeStep:
    """`step(input_ids, cache, start, num_logits)`: the final-normed hidden states `[num_logits, d]` of a
    one-window decoder's pass over a few new tokens, its keys and values written into `cache` as the adapter's own
    pass writes them. Build with `for_adapter`."""

    def __init__(self, model: native.StepModel, layers: Any, keep: list[torch.Tensor], score_slots: int,
                 rows: int, takes_prompts: bool = False) -> None:
        self.model = model
        self.layers = layers  # the ctypes array the model points into
        self.keep = keep  # every tensor a pointer refers to
        self.score_slots = score_slots  # the encoder's frames in whole tiles: a row's cross-attention scores
        self.max_rows = rows
        # Whether the window's prompt pass runs here too (a packed float32 model's: the same numbers, its products
        # summed in the step's order; the int8 model's where `int8_prompts_here`, else bfloat16; not a draft's,
        # whose bfloat16 prompt products are faster).
        self.takes_prompts = takes_prompts
        self.scratch = torch.empty(0)
        # The stored window each row of a batch reads (`rows_step`); `remapped` as rows leave or are reordered.
        self.windows = torch.arange(1)

    @staticmethod
    def for_adapter(adapter: Any, model: torch.nn.Module, drafting: bool) -> "NativeStep | None":
        """The native step for `adapter` (a `WhisperDecoderAdapter` over one window of `model`; a `drafting`
        copy's reads its cross-attention keys and values in bfloat16), or None where it does not apply: no native
        kernels (or `onednn_only()`, `reference_kernels()`), another device, an offloaded or not-float32 decoder,
        a product in another form, an activation other than GELU, head sizes not a multiple of 16."""
        if native.library() is None or not native_rows_allowed() or adapter.device.type != "cpu" \
                or adapter.store is not None \
                or adapter.dtype != torch.float32 or adapter.kv_dtype != torch.float32 \
                or adapter.head_dim % 16 or adapter.embed_tokens.dtype not in (torch.float32, torch.bfloat16):
            return None
        config = model.config
        if getattr(config, "activation_function", "gelu") != "gelu":
            return None
        # A model whose keys and values are bfloat16 values (`adapter.cross_rounding`) loses nothing read so.
        bf16_cross = drafting or adapter.cross_rounding == torch.bfloat16
        cross_dtype = torch.bfloat16 if bf16_cross else torch.float32
        decoder = model.get_decoder()
        pack = _packs(decoder)
        keep: list[torch.Tensor] = []
        layers = (native.StepLayer * len(decoder.layers))()
        for index, layer in enumerate(decoder.layers):
            keys, values = adapter.cross[index]
            parts = {
                "norm_self": _norm(layer.self_attn_layer_norm, keep),
                **dict(zip("qkv", _projections(layer.self_attn, keep, pack))),
                "out": _linear(layer.self_attn.out_proj, keep, pack),
                "norm_cross": _norm(layer.encoder_attn_layer_norm, keep),
                "cross_q": _linear(layer.encoder_attn.q_proj, keep, pack),
                "cross_out": _linear(layer.encoder_attn.out_proj, keep, pack),
                "norm_ffn": _norm(layer.final_layer_norm, keep), "fc1": _linear(layer.fc1, keep, pack),
                "fc2": _linear(layer.fc2, keep, pack),
            }
            if any(part is None for part in parts.values()) or keys.dtype != torch.float32 or not keys.is_contiguous():
                return None
            entry = layers[index]
            for name in ("norm_self", "norm_cross", "norm_ffn"):
                setattr(entry, f"{name}_w", parts[name][0])
                setattr(entry, f"{name}_b", parts[name][1])
            for name in ("q", "k", "v", "out", "cross_q", "cross_out", "fc1", "fc2"):
                setattr(entry, name, parts[name])
            # A draft's in bfloat16: half the bytes its step reads, and it does not miss the rounding. Each
            # window's heads one after another (`decoder_step_windows` reads a batch's).
            entry.cross_k = _tensor(_tiles(keys.flatten(0, 1).to(cross_dtype)), keep)
            entry.cross_v = _tensor(values.to(cross_dtype).contiguous(), keep)
        final = _norm(decoder.layer_norm, keep)
        if final is None:
            return None
        windows, frames = adapter.batch_size, adapter.cross[0][0].shape[-2]
        step = native.StepModel(
            layers=len(decoder.layers), d=config.d_model, heads=adapter.heads, frames=frames,
            ffn=config.decoder_ffn_dim, capacity=0, cross_kind=native.WEIGHT_KINDS[cross_dtype],
            embed_kind=native.WEIGHT_KINDS[adapter.embed_tokens.dtype], eps=adapter.eps,
            layer=ctypes.cast(layers, ctypes.POINTER(native.StepLayer)),
            embed_tokens=_tensor(adapter.embed_tokens.detach().contiguous(), keep),
            embed_positions=_tensor(adapter.embed_positions.detach().contiguous(), keep),
            norm_w=final[0], norm_b=final[1], window_k=adapter.heads * -(-frames // 16) * 16 * adapter.head_dim,
            window_v=adapter.heads * frames * adapter.head_dim)
        # A decoder whose rows must not depend on the pass's width (the int8 model: `adapter.span`) steps through
        # here for every width decoding meets; the others for the widths where one call beats the layers'.
        rows = MANY_ROWS - 1 if adapter.span is not None else PACKED_ROWS if pack else STEP_ROWS
        takes_prompts = not drafting and (pack and adapter.span is None and adapter.embed_tokens.dtype == torch.float32
                                          or adapter.span is not None and int8_prompts_here())
        native_step = NativeStep(step, layers, keep, -(-frames // 16) * 16, rows, takes_prompts)
        native_step.windows = torch.arange(windows)
        return native_step

    def remapped(self, rows: torch.Tensor) -> "NativeStep":
        """The same step for a batch whose row i is this batch's row `rows[i]` (windows finished or reordered)."""
        step = copy.copy(self)
        step.windows = self.windows[rows.cpu()]
        step.scratch = torch.empty(0)
        return step

    def window(self, row: int) -> "NativeStep":
        """The step of the window that this batch's row `row` reads, alone: its keys and values where the batch's
        lie (nothing copied), the bits `for_adapter` over that window alone gives."""
        step = copy.copy(self)
        step.layers = (native.StepLayer * len(self.layers))()
        ctypes.memmove(step.layers, self.layers, ctypes.sizeof(step.layers))
        kinds = {kind: dtype for dtype, kind in native.WEIGHT_KINDS.items()}
        window, size = int(self.windows[row]), kinds[self.model.cross_kind].itemsize
        for entry in step.layers:
            entry.cross_k += window * self.model.window_k * size
            entry.cross_v += window * self.model.window_v * size
        step.model = native.StepModel.from_buffer_copy(self.model)
        step.model.layer = ctypes.cast(step.layers, ctypes.POINTER(native.StepLayer))
        step.windows, step.scratch = torch.arange(1), torch.empty(0)
        return step

    def applies(self, cache: StaticKVCache, width: int) -> bool:
        """Whether a pass of `width` new tokens over `cache` can run here (one row, contiguous buffers)."""
        return 0 < width <= self.max_rows and cache.keys.shape[1] == 1 and len(self.windows) == 1 \
            and self._buffers_fit(cache)

    def applies_to_rows(self, cache: StaticKVCache) -> bool:
        """Whether `rows_step` can run over `cache` (a row per window of this batch, contiguous buffers)."""
        return cache.keys.shape[1] == len(self.windows) and self._buffers_fit(cache)

    def _fit(self, cache: StaticKVCache, rows: int, score_rows: int) -> None:
        """The model's capacity set to `cache`'s, and scratch for `rows` rows and `score_rows` rows of scores."""
        model = self.model
        model.capacity = cache.keys.shape[3]
        needed = rows * (6 * model.d + model.ffn) + score_rows * max(self.score_slots, model.capacity)
        if self.scratch.numel() < needed:
            self.scratch = torch.empty(needed)

    @staticmethod
    def _buffers_fit(cache: StaticKVCache) -> bool:
        return cache.keys.is_contiguous() and cache.values.is_contiguous() and cache.keys.dtype == torch.float32

    def rows_step(self, input_ids: torch.Tensor, positions: torch.Tensor, first: torch.Tensor, cache: StaticKVCache,
                  slot: int) -> torch.Tensor:
        """One new token for each row of a batch of windows (`[rows]` ids at `[rows]` positions, written at cache
        slot `slot`), row r attending over its slots `first[r]`..`slot`: the final-normed hidden states `[rows, d]`,
        each row's the bits of a one-token step of its window alone over the same keys and values."""
        rows = input_ids.shape[0]
        threads = torch.get_num_threads()
        model = self.model
        self._fit(cache, rows, threads)  # one row of scores a thread: each attends for one row at a time
        ids, positions, first = (t.to(torch.int64).contiguous() for t in (input_ids, positions, first))
        out = torch.empty(rows, model.d)
        native.library().decoder_step_windows(ctypes.addressof(model), ids.data_ptr(), positions.data_ptr(),
                                              first.data_ptr(), self.windows.data_ptr(), rows, slot,
                                              cache.keys.data_ptr(), cache.values.data_ptr(),
                                              self.scratch.data_ptr(), out.data_ptr(), threads)
        return out

    def __call__(self, input_ids: torch.Tensor, cache: StaticKVCache, start: int, num_logits: int) -> torch.Tensor:
        width = input_ids.shape[1]
        ids = input_ids.reshape(-1).to(torch.int64).contiguous()
        threads = torch.get_num_threads()
        model = self.model
        self._fit(cache, width, width * threads)
        out = torch.empty(num_logits, model.d)
        native.library().decoder_step(ctypes.addressof(model), ids.data_ptr(), width, start, cache.keys.data_ptr(),
                                    cache.values.data_ptr(), self.scratch.data_ptr(), out.data_ptr(), num_logits,
                                    threads)
        return out
