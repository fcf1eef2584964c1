"""Whisper's decoder as the generic engine sees it: a model adapter over a batch of windows' encoder outputs."""

from __future__ import annotations

import copy
import itertools
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import torch
import torch.nn.functional as F

from asr.models.offload import offload_store
from decoding.causal_lm import layer_norm_fn, linear_fn
from decoding.kernels.graphed_step import graphed_steps
from decoding.kernels.native_step import NativeStep
from decoding.kernels.products import Attention, linear, prompt_pass
from decoding.kernels.screened_head import screened_head
from decoding.kv_cache import StaticKVCache, causal_mask


class WhisperDecoderAdapter:
    """A Whisper decoder reading a batch of windows' encoder outputs, with preallocated key/value buffers.

    A transformers decoder step spends on a CPU about as long in Python and cache bookkeeping as in arithmetic.
    This pass runs the decoder's own weights through the same functions in
    transformers' order, so its fp32 logits are bit for bit transformers' (tests/test_decoder.py), but keeps
    keys and values in buffers written by position (gpt-fast's KVCache), computes the cross-attention keys
    and values once per window, and calls each layer's functions directly rather than through nn.Module
    (docs/benchmarks.md has the step costs).

    Works for `WhisperForConditionalGeneration`, decoder-only `WhisperForCausalLM` assistants (distil-whisper
    style) and the low-precision decoder copies (bf16, int8 linears, fused projections) alike.
    """

    def __init__(self, model: torch.nn.Module, encoder_output: torch.Tensor, capacity: int = 256,
                 drafting: bool = False) -> None:
        decoder = model.get_decoder()
        # Steps after the prompt may run as one native call (`decoding.kernels.native_step`), built at the first step
        # that can use it; a drafting copy's reads its cross-attention in bfloat16 (the model checks its tokens).
        self.model = model
        self.drafting = drafting
        self._native_step: NativeStep | None | bool = None
        # Offloaded layers (asr.models.offload) are planned per pass, over weights fetched just before they run.
        self.store = offload_store(model)
        offloaded = self.store.layers if self.store is not None else {}
        self.layers = [None if i in offloaded else _LayerPlan.of(layer) for i, layer in enumerate(decoder.layers)]
        self.activation = decoder.layers[0].activation_fn.forward
        self.eps = decoder.layers[0].final_layer_norm.eps
        # A drafting copy may look tokens up in the model's own embedding (`shared_embedding`) and round the rows
        # it reads: the same values as a rounded copy of the table, without a second table.
        shared = getattr(model, "shared_embedding", None)
        self.embed_tokens = shared if shared is not None else decoder.embed_tokens.weight
        self.embed_positions = decoder.embed_positions.weight
        self.layer_norm = layer_norm_fn(decoder.layer_norm)
        self.head = model.get_output_embeddings()
        self.proj_out = linear_fn(self.head)
        config = model.config
        self.heads = config.decoder_attention_heads
        self.head_dim = config.d_model // self.heads
        self.vocab_size = int(config.vocab_size)
        self.max_length = int(config.max_target_positions)
        self.device = encoder_output.device
        self.dtype = self.embed_positions.dtype
        # Self-attention over a fixed number of key slots (masked past each row's position) for decoders whose
        # other products compute each row on its own (`asr.models.precision.quantize_model`): then a row's softmax and
        # weighted sum run over the same slots in a one-token step and in a check of many drafts, and its
        # logits are the same bits either way. Over only the filled slots, the sums' order follows their count.
        self.span = getattr(model, "attention_span", None)
        self.capacity = max(capacity, self.span or 0)
        self.attention = Attention(self.device, exact_rows=self.span is not None)
        self.kv_dtype = self.attention.dtype(self.dtype)
        # A model may keep its cross-attention keys and values at a lower precision (the int8 model: bfloat16).
        self.cross_rounding: torch.dtype | None = getattr(model, "cross_attention_dtype", None)
        rounding = self.cross_rounding

        def project(fn: Fn, x: torch.Tensor) -> torch.Tensor:
            y = fn(x)
            return y.to(rounding).to(y.dtype) if rounding is not None else y

        self._cross_rows: torch.Tensor | None = None  # rows `select` kept, not yet gathered (`cross`)
        with torch.inference_mode():
            encoder_output = encoder_output.to(self.dtype)
            self.cross = [(self.attention.prepare(self._split(project(layer.cross_k, encoder_output))),
                           self.attention.prepare(self._split(project(layer.cross_v, encoder_output)), keys=False))
                          for layer in self._plans()]
        # Renewed whenever `cross` is: graphs copy the keys and values into their buffers when it changes.
        self.cross_version = next(_CROSS_VERSIONS)
        # On a GPU, steps after the prompt replay CUDA graphs (`decoding.kernels.graphed_step`).
        self.graphs = graphed_steps(self)

    def _plans(self) -> Iterator[_LayerPlan]:
        """Each layer's functions in order; an offloaded layer's weights are fetched as its turn comes (the store
        reads the next one meanwhile) and let go of when the layer after it is fetched."""
        for index, plan in enumerate(self.layers):
            yield plan if plan is not None else _LayerPlan.of_weights(self.store.fetch(index), self.activation,
                                                                       self.eps)

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        """`[B, T, d]` -> `[B, heads, T, head_dim]`."""
        return x.view(x.shape[0], x.shape[1], self.heads, self.head_dim).transpose(1, 2)

    def new_cache(self, batch_size: int = 1) -> StaticKVCache:
        cache = self.graphs.new_cache(self, batch_size) if self.graphs is not None else None
        if cache is None:
            cache = StaticKVCache.empty(len(self.layers), batch_size, self.heads, self.head_dim, self.capacity,
                                        self.kv_dtype, self.device)
        return cache

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, cache: StaticKVCache, num_logits: int,
                attention_mask: torch.Tensor | None = None, position_ids: torch.Tensor | None = None) -> torch.Tensor:
        start = cache.length
        end = start + input_ids.shape[1]
        cache.ensure(end)
        logits = None
        if self.graphs is not None:
            logits = self.graphs.forward(self, input_ids, cache, start, num_logits, attention_mask, position_ids)
        if logits is None:
            logits = self.pass_through_layers(input_ids, cache, start, num_logits, attention_mask, position_ids)
        cache.length = end
        return logits

    def prompt_takes_steps(self, width: int) -> bool:
        """Whether one window's pass over its whole prompt and first drafts, `width` tokens in all, gives every
        token the numbers a step gives it (the native step takes the prompt), so the engine may feed them at once."""
        step = self._step() if self.batch_size == 1 else None
        return step is not None and step.takes_prompts and 0 < width <= step.max_rows

    def pass_through_layers(self, input_ids: torch.Tensor, cache: StaticKVCache, start: int, num_logits: int,
                            attention_mask: torch.Tensor | None, position_ids: torch.Tensor | None,
                            native_step: bool = True) -> torch.Tensor:
        """`forward`'s logits without a graph, the keys and values written from slot `start` (the cache's length
        left to the caller); through the layers alone, never the native step, unless `native_step`."""
        batch, width = input_ids.shape
        if native_step and attention_mask is None and position_ids is None:
            step = self._step()
            if step is not None and (start > 0 or step.takes_prompts) and step.applies(cache, width):  # causal
                return self.proj_out(step(input_ids, cache, start, num_logits)[None]).float()
        if native_step and isinstance(start, int) and start == 0 and batch > 1 and self._prompts_in_step(width):
            logits = self._prompts_alone(input_ids, cache, num_logits, attention_mask, position_ids)
            if logits is not None:
                return logits
        if native_step and isinstance(start, int) and start > 0 and width == 1 and batch > 1:
            hidden = self._rows_step(input_ids, cache, start, attention_mask, position_ids)
            if hidden is not None:
                return self.proj_out(hidden[:, None]).float()
        if self.span is not None:
            attention_mask = _over_span(attention_mask, start, width, self.span, self.device)
        elif attention_mask is None and width > 1:
            attention_mask = causal_mask(start, width, self.device)
        if position_ids is None:
            position_ids = torch.arange(start, start + width, device=self.device).expand(batch, width)
        x = self.embed(input_ids, position_ids)
        with prompt_pass(start == 0):
            x = self.layers_over(x, cache, start, attention_mask)
        return self.proj_out(self.layer_norm(x[:, width - num_logits:])).float()

    def _prompts_alone(self, input_ids: torch.Tensor, cache: StaticKVCache, num_logits: int,
                       attention_mask: torch.Tensor | None, position_ids: torch.Tensor | None) -> torch.Tensor | None:
        """A batch's prompt pass (rows left-padded, an empty cache) as each window's alone, in its step, its keys
        and values copied into its slots (the padding's zeroed, masked). Through the layers, a batch's rows took
        bfloat16 products (~1e-3 off) and flipped a word of `asr serve`'s int8 answers. None: not such prompts."""
        batch, width = input_ids.shape
        lengths = []
        for row in range(batch):
            valid = attention_mask[row, 0, -1, :width].cpu() if attention_mask is not None else None
            length = int(valid.sum()) if valid is not None else width
            if length == 0 or valid is not None and not bool(valid[width - length:].all()):
                return None
            positions = position_ids[row, width - length:].cpu() if position_ids is not None else None
            if positions is not None and not torch.equal(positions, torch.arange(length)):
                return None
            lengths.append(length)
        logits, batch_step = None, self._step()
        for row, length in enumerate(lengths):
            own = self.new_cache(1)
            own.ensure(length)
            got = self.proj_out(batch_step.window(row)(input_ids[row:row + 1, width - length:], own, 0,
                                                         min(num_logits, length))[None]).float()[0]
            logits = got.new_zeros(batch, num_logits, got.shape[-1]) if logits is None else logits
            logits[row, num_logits - len(got):] = got
            for name in ("keys", "values"):
                ours, theirs = getattr(cache, name), getattr(own, name)
                ours[:, row, :, width - length:width] = theirs[:, 0, :, :length]
                ours[:, row, :, :width - length] = 0
        return logits

    def _prompts_in_step(self, width: int) -> bool:
        """Whether a window's prompt of `width` tokens alone runs in the step (the int8 model without AMX)."""
        step = self._step() if self.span is not None else None
        return step is not None and step.takes_prompts and width <= step.max_rows

    def _rows_step(self, input_ids: torch.Tensor, cache: StaticKVCache, start: int, attention_mask: torch.Tensor | None,
                   position_ids: torch.Tensor | None) -> torch.Tensor | None:
        """A batch's one-token step as one native call (`NativeStep.rows_step`: each row the bits of its window's
        step alone, the weights read once for all rows), where every row's visible slots are one run up to the new
        token's (a ragged batch's left-padded prompts; not the holes rejected drafts leave); else None."""
        step = self._step()
        if step is None or not step.applies_to_rows(cache):
            return None
        batch = input_ids.shape[0]
        first = torch.zeros(batch, dtype=torch.int64)
        if attention_mask is not None:
            if attention_mask.dtype != torch.bool or attention_mask.shape[-1] != start + 1:
                return None
            visible = attention_mask.reshape(batch, start + 1).cpu()
            first = visible.to(torch.int8).argmax(-1)
            if not bool((visible.sum(-1) == start + 1 - first).all()) or not bool(visible[:, -1].all()):
                return None
        positions = position_ids[:, 0].cpu() if position_ids is not None else torch.full((batch,), start)
        return step.rows_step(input_ids[:, 0].cpu(), positions, first, cache, start)

    def embed(self, input_ids: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        """`[B, T]` token ids at `[B, T]` positions -> the first layer's input `[B, T, d]`."""
        return F.embedding(input_ids, self.embed_tokens).to(self.dtype) + self.embed_positions[position_ids]

    def _step(self) -> NativeStep | None:
        if self._native_step is None:
            self._native_step = NativeStep.for_adapter(self, self.model, self.drafting) or False
        return self._native_step or None

    @torch.inference_mode()
    def alignment_pass(self, input_ids: torch.Tensor, heads: Sequence[tuple[int, int]]) -> tuple[torch.Tensor,
                                                                                                 torch.Tensor]:
        """One pass over `[1, T]` tokens from an empty cache, over the cross-attention keys and values already
        projected for decoding (word timestamps need no second projection of the encoder output): the float32
        logits at every position `[T, vocab]` and the cross-attention weights of the `(layer, head)` pairs
        `[len(heads), T, frames]`."""
        width = input_ids.shape[1]
        cache = StaticKVCache.empty(len(self.layers), 1, self.heads, self.head_dim, width, self.kv_dtype, self.device)
        chosen = {layer: [h for at, h in heads if at == layer] for layer, _ in heads}
        wanted: dict[int, Any] = {layer: list(h) for layer, h in chosen.items()}
        x = self.embed(input_ids, torch.arange(width, device=self.device)[None])
        with prompt_pass():
            x = self.layers_over(x, cache, 0, causal_mask(0, width, self.device), wanted)
        logits = linear_fn(self.head)(self.layer_norm(x))[0].float()
        return logits, torch.stack([wanted[layer][0, chosen[layer].index(head)] for layer, head in heads])

    def layers_over(self, x: torch.Tensor, cache: StaticKVCache, start: int | torch.Tensor,
                    attention_mask: torch.Tensor | None, cross_weights: dict[int, Any] | None = None) -> torch.Tensor:
        """The decoder layers over `[batch, width, d]` hidden states, their keys and values written at cache slots
        from `start` on; or at the `[width]` slots `start` holds, self-attention then reading every slot the cache
        has, as `attention_mask` (`[B or 1, 1, width, capacity]`) allows (a graph's fixed shapes). `cross_weights`
        maps layers to lists of heads, each list replaced by those heads' cross-attention weights (float32
        `[batch, len(list), width, frames]`)."""
        batch, width = x.shape[:2]
        split = self._split
        for index, layer in enumerate(self._plans()):
            q, k, v = layer.qkv(layer.norm_self(x))
            if isinstance(start, torch.Tensor):
                k, v = cache.write_at(index, start, split(k), split(v))
            else:
                k, v = cache.write(index, start, split(k), split(v))
            if self.span is not None:
                k, v = cache.keys[index, :, :, :self.span], cache.values[index, :, :, :self.span]
            a = self.attention(split(q), k, v, attention_mask)
            x = x + layer.out(a.transpose(1, 2).reshape(batch, width, -1))
            keys, values = self.cross[index]
            q = split(layer.cross_q(layer.norm_cross(x)))
            if cross_weights is not None and index in cross_weights:
                chosen = cross_weights[index]
                cross_weights[index] = self.attention.weights(q[:, chosen], keys[:, chosen])
            a = self.attention(q, keys, values, ready=True)
            x = x + layer.cross_out(a.transpose(1, 2).reshape(batch, width, -1))
            x = x + layer.fc2(layer.activation(layer.fc1(layer.norm_ffn(x))))
        return x

    @property
    def cross(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Each layer's cross-attention keys and values `[batch, heads, frames, head_dim]`, as `prepare` lays them
        out; the rows `select` kept are gathered when first read (a batch's native step reads them where they lie,
        so a batch that only steps there never copies them as its windows finish)."""
        if self._cross_rows is not None:
            rows, self._cross_rows = self._cross_rows, None
            self._cross = [(k[rows], v[rows]) for k, v in self._cross]
        return self._cross

    @cross.setter
    def cross(self, pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        self._cross, self._cross_rows = pairs, None

    @property
    def batch_size(self) -> int:
        """How many windows this decoder reads."""
        return len(self._cross_rows) if self._cross_rows is not None else len(self._cross[0][0])

    def rows(self, indices: list[int]) -> "WhisperDecoderAdapter":
        """The same decoder over some of its windows, sharing their cross-attention keys and values (a
        temperature fallback or language detection reuses them instead of projecting the encoder output again)."""
        # Always a copy: `select` (rows finishing during generation) rebinds the copy's list, not this one's.
        subset = copy.copy(self)
        if indices != list(range(self.batch_size)):
            index = torch.tensor(indices, device=self.device)
            subset._native_step = None  # built over these windows' keys and values
            subset.cross = [(k.index_select(0, index), v.index_select(0, index)) for k, v in self.cross]
            subset.cross_version = next(_CROSS_VERSIONS)
        return subset

    def screened(self, exact_ids: Sequence[int]) -> "WhisperDecoderAdapter":
        """The same decoder with its float32 head screened through bfloat16 for greedy decoding
        (`decoding.kernels.screened_head`): the same argmax, the logits of `exact_ids` in float32; itself where the
        screen does not apply, or for an offloaded model (whose memory the screen's bfloat16 copy would take)."""
        head = screened_head(self.head, exact_ids) if self.store is None else None
        if head is None:
            return self
        screened = copy.copy(self)
        screened.proj_out = head
        screened.graphs = None  # a CPU-only head, and no graph could record its data-dependent recomputation
        return screened

    def crop(self, cache: StaticKVCache, length: int) -> None:
        cache.crop(length)

    def select(self, cache: StaticKVCache, rows: torch.Tensor) -> None:
        self.select_cache(cache, rows)
        self._cross_rows = rows if self._cross_rows is None else self._cross_rows[rows]
        self.cross_version = next(_CROSS_VERSIONS)
        # A batch's native step reads the windows it was built over where they lie; one window is built anew (its
        # steps of several tokens read window 0).
        step = self._native_step
        self._native_step = step.remapped(rows) if isinstance(step, NativeStep) and len(rows) > 1 else None

    def select_cache(self, cache: StaticKVCache, rows: torch.Tensor) -> None:
        """`select` where every new row reads the same window as the row now in its place (beams of one window
        reordered): the cross-attention keys and values stay as they are."""
        if self.graphs is None or not self.graphs.select(self, cache, rows):
            cache.select(rows)


Fn = Callable[[torch.Tensor], Any]
_CROSS_VERSIONS = itertools.count()


def _over_span(mask: torch.Tensor | None, start: int, width: int, span: int, device: torch.device) -> torch.Tensor:
    """`[B or 1, 1, width, span]` boolean: the causal mask (or the given `[B, 1, width, start + width]` one) over
    every slot up to `span`, the slots past the written ones masked."""
    if mask is None:
        return causal_mask(start, width, device, slots=span)
    return F.pad(mask, (0, span - mask.shape[-1]), value=False)


@dataclass(frozen=True)
class _LayerPlan:
    """One decoder layer as plain functions of its weights (the same kernels nn.Module would call)."""

    norm_self: Fn
    qkv: Fn
    out: Fn
    norm_cross: Fn
    cross_q: Fn
    cross_k: Fn
    cross_v: Fn
    cross_out: Fn
    norm_ffn: Fn
    fc1: Fn
    activation: Fn
    fc2: Fn

    @staticmethod
    def of(layer: Any) -> "_LayerPlan":
        attention, cross = layer.self_attn, layer.encoder_attn
        return _LayerPlan(
            norm_self=layer_norm_fn(layer.self_attn_layer_norm), qkv=_qkv(attention),
            out=linear_fn(attention.out_proj), norm_cross=layer_norm_fn(layer.encoder_attn_layer_norm),
            cross_q=linear_fn(cross.q_proj), cross_k=linear_fn(cross.k_proj), cross_v=linear_fn(cross.v_proj),
            cross_out=linear_fn(cross.out_proj), norm_ffn=layer_norm_fn(layer.final_layer_norm),
            fc1=linear_fn(layer.fc1), activation=layer.activation_fn.forward, fc2=linear_fn(layer.fc2),
        )


    @staticmethod
    def of_weights(weights: dict[str, torch.Tensor], activation: Fn, eps: float) -> "_LayerPlan":
        """The same functions over a fetched layer's weights (names as in the layer's state dict)."""
        def project(name: str) -> Fn:
            return linear(weights[f"{name}.weight"], weights.get(f"{name}.bias"))

        def norm(name: str) -> Fn:
            weight, bias = weights[f"{name}.weight"], weights[f"{name}.bias"]
            return lambda x: F.layer_norm(x, weight.shape, weight, bias, eps)

        q, k, v = project("self_attn.q_proj"), project("self_attn.k_proj"), project("self_attn.v_proj")
        return _LayerPlan(
            norm_self=norm("self_attn_layer_norm"), qkv=lambda h: (q(h), k(h), v(h)), out=project("self_attn.out_proj"),
            norm_cross=norm("encoder_attn_layer_norm"), cross_q=project("encoder_attn.q_proj"),
            cross_k=project("encoder_attn.k_proj"), cross_v=project("encoder_attn.v_proj"),
            cross_out=project("encoder_attn.out_proj"), norm_ffn=norm("final_layer_norm"), fc1=project("fc1"),
            activation=activation, fc2=project("fc2"),
        )


def _qkv(attention: Any) -> Fn:
    """Query, key and value projections: one fused matmul where the copy has one (`fuse_layer_qkv`), else three."""
    fused = getattr(attention, "qkv_proj", None)
    if fused is not None:
        width = fused.out_features // 3
        project = linear_fn(fused)
        return lambda h: project(h).split(width, dim=-1)
    q, k, v = linear_fn(attention.q_proj), linear_fn(attention.k_proj), linear_fn(attention.v_proj)
    return lambda h: (q(h), k(h), v(h))
