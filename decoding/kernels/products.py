"""The kernels a decoder step runs on a CPU: oneDNN matrix products, and attention that suits a few query rows.

A decoder step reads every weight once for a handful of rows, so on a CPU its time is memory traffic. PyTorch's
`F.linear` calls MKL's sgemm, which on the AMD EPYC machines we measured streams a large weight (Whisper base's
51,865 x 512 head) at half the speed oneDNN's `_linear_pointwise` reaches on the same dense weights (no copy, no
reordering), and takes much longer for six rows than for one, where oneDNN checks six rows in about the time
of one (docs/precision.md has the figures). (The encoder's 1,500-row products
run at the CPU's peak either way.)

Products of a float32 weight with at most `native.MAX_ROWS` rows (every decoder step, checks of a few drafts) go
through `decoding.kernels.native` instead where it could be built: one pass over the weight at nearly the speed of
memory, each row's sums in one fixed order. `onednn_only()` keeps oneDNN for them, for comparisons.
`reference_kernels()` selects PyTorch's defaults instead of both, for comparisons and for bit-for-bit checks against
transformers. `full_head()` turns the screen of a float32 head off. These switches are context managers only (a
benchmark or `asr eval`'s `kernels=` sets them around what it runs); nothing here reads the environment.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F

from decoding.kernels import native

Fn = Callable[[torch.Tensor], torch.Tensor]

# Whether functions built here use PyTorch's default kernels; on with `reference_kernels()`.
_REFERENCE = contextvars.ContextVar("reference_kernels", default=False)


# Whether greedy decoding over a float32 head may not screen it (`screened_head`); on with `full_head()`.
_FULL_HEAD = contextvars.ContextVar("full_head", default=False)


# Whether few-row float32 products keep oneDNN instead of `native`; on with `onednn_only()`.
_ONEDNN_ONLY = contextvars.ContextVar("onednn_only", default=False)


# Whether the decoder pass now running fills an empty cache (`prompt_pass`).
_PROMPT = contextvars.ContextVar("prompt_pass", default=False)


@contextlib.contextmanager
def _switched(switch: contextvars.ContextVar, on: bool) -> Iterator[None]:
    token = switch.set(on)
    try:
        yield
    finally:
        switch.reset(token)


def reference_kernels(on: bool = True) -> contextlib.AbstractContextManager[None]:
    """Within the block, functions built here use PyTorch's default kernels (`F.linear`, SDPA) when `on`."""
    return _switched(_REFERENCE, on)


def in_reference_kernels() -> bool:
    """Whether a `reference_kernels()` block is running."""
    return _REFERENCE.get()


def full_head(on: bool = True) -> contextlib.AbstractContextManager[None]:
    """Within the block, greedy decoding computes every logit of a float32 head in float32 when `on` (this
    library's other kernels stay), for comparisons with the screened head."""
    return _switched(_FULL_HEAD, on)


def onednn_only(on: bool = True) -> contextlib.AbstractContextManager[None]:
    """Within the block, functions built here multiply few rows through oneDNN, not `native`'s kernels, when
    `on`."""
    return _switched(_ONEDNN_ONLY, on)


def prompt_pass(on: bool = True) -> contextlib.AbstractContextManager[None]:
    """Within the block, the decoder pass running fills an empty cache (a window's prompt) when `on`: that pass is
    the same call in plain and assisted decoding, so its many rows need not each get a one-token step's bits."""
    return _switched(_PROMPT, on)


def in_prompt_pass() -> bool:
    return _PROMPT.get()


# From this many rows on, a product over int8 or widened bfloat16 weights runs in bfloat16 over the weights as they
# are or dequantised; decoding (drafts and their checks) stays below it, so every decoded row takes the same kernel.
MANY_ROWS = 256


def row_by_row(rows: int) -> bool:
    """Whether a product of `rows` rows over int8 or widened bfloat16 weights runs row by row (`native`):
    decoding's steps and checks do; a prompt's many rows (the same call in plain and assisted decoding) and an
    encoder output's do not, as the weights dequantised once and a bfloat16 product take a fraction of the time."""
    return rows < MANY_ROWS and not (rows > native.MAX_ROWS and in_prompt_pass())


def native_rows_allowed(weight: torch.Tensor | None = None) -> bool:
    """Whether few-row products (over `weight`, when given: dense float32 on a CPU) may use `decoding.kernels.native`
    here: not under `reference_kernels()` or `onednn_only()`, and the library built."""
    if _REFERENCE.get() or _ONEDNN_ONLY.get():
        return False
    if weight is not None and not (weight.device.type == "cpu" and weight.dtype == torch.float32
                                   and weight.layout == torch.strided and weight.is_contiguous()):
        return False
    return native.library() is not None


def native_bfloat16() -> bool:
    """Whether this CPU computes bfloat16 products natively (AVX512-BF16 or AMX tiles)."""
    return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())


def screening_allowed() -> bool:
    """Whether a float32 head may be screened through bfloat16 here: oneDNN kernels on a CPU with native
    bfloat16, not `reference_kernels()` or `full_head()`."""
    return (not _REFERENCE.get() and not _FULL_HEAD.get() and torch.backends.mkldnn.is_available()
            and native_bfloat16())


def _onednn(weight: torch.Tensor) -> bool:
    return (not _REFERENCE.get() and weight.device.type == "cpu" and weight.dtype in (torch.float32, torch.bfloat16)
            and weight.layout == torch.strided and torch.backends.mkldnn.is_available())


def _onednn_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """oneDNN's linear with no fused activation; `weight` dense or packed (`OneDnnLinear.pack`)."""
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


def _few_rows(x: torch.Tensor) -> bool:
    return x.dtype == torch.float32 and x.numel() <= native.MAX_ROWS * x.shape[-1]


def linear(weight: torch.Tensor, bias: torch.Tensor | None, packed: torch.Tensor | None = None) -> Fn:
    """`x -> x @ weight.T + bias` through oneDNN on a CPU (float32, bfloat16; over `packed`, the weight in
    oneDNN's layout, when given), few float32 rows through `decoding.kernels.native` where allowed, `F.linear`
    elsewhere."""
    if _onednn(weight):
        operand = weight if packed is None else packed
        if native_rows_allowed(weight):
            return lambda x: native.rowdot(x, weight, bias) if _few_rows(x) else _onednn_linear(x, operand, bias)
        return lambda x: _onednn_linear(x, operand, bias)
    return lambda x: F.linear(x, weight, bias)


class OneDnnLinear(torch.nn.Linear):
    """An `nn.Linear` whose inference runs through `linear`; with gradients on, it is `F.linear` (oneDNN's op
    has no backward). Installed over a loaded model's layers by `use_onednn` (same parameters, same state dict)."""

    # The weight in oneDNN's own layout as well (`pack`), or None.
    packed: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad) or not _onednn(self.weight):
            return F.linear(x, self.weight, self.bias)
        if _few_rows(x) and native_rows_allowed(self.weight):
            return native.rowdot(x, self.weight, self.bias)
        return _onednn_linear(x, self.weight if self.packed is None else self.packed, self.bias)

    def __getstate__(self) -> dict:
        # Copies and pickles leave the packed copy out (an opaque oneDNN tensor cannot be copied); `pack` again.
        state = dict(self.__dict__)
        state.pop("packed", None)
        return state

    def pack(self) -> None:
        """Keeps a second copy of the weight in oneDNN's blocked layout. Worth its memory for the output head
        (51,865 rows read per token: a measurably cheaper pass, docs/precision.md); for the other layers it made
        no difference."""
        if _onednn(self.weight) and (self.packed is None or self.packed.dtype != self.weight.dtype):
            self.packed = torch.ops.mkldnn._reorder_linear_weight(self.weight.detach())


class WidenedLinear(torch.nn.Module):
    """`y = x @ weight.T + bias` in float32 over bfloat16 weights, each widened exactly as it is read: half the bytes
    of float32 weights, and every row's result its own (`native`'s kernel for any count of decoded rows, so a check
    of drafts gives each row a one-token step's bits). Greedy decoding screens it like a float32 head
    (`screened_head`): its argmax is then this product's. Products of many rows (an encoder output, a prompt) take
    oneDNN's bfloat16 product instead, as an int8 linear does. Needs `native`."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        super().__init__()
        if weight.dtype != torch.bfloat16:
            raise ValueError(f"WidenedLinear takes bfloat16 weights, not {weight.dtype}")
        # A Parameter, so that a tied token table stays one tensor.
        self.weight = weight if isinstance(weight, torch.nn.Parameter) else torch.nn.Parameter(weight, False)
        self.register_buffer("bias", None if bias is None else bias.detach().float())
        self.out_features, self.in_features = weight.shape

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features)
        if row_by_row(len(flat)):
            y = native.rowdot(flat, self.weight, self.bias)
        else:
            bias = None if self.bias is None else self.bias.to(torch.bfloat16)
            y = linear(self.weight, bias)(flat.to(torch.bfloat16)).float()
        return y.view(*x.shape[:-1], self.out_features)

    def to_linear(self) -> torch.nn.Linear:
        """A plain float32 Linear with the widened weights."""
        out = torch.nn.Linear(self.in_features, self.out_features, bias=self.bias is not None,
                              device=self.weight.device)
        with torch.no_grad():
            out.weight.copy_(self.weight)
            if self.bias is not None:
                out.bias.copy_(self.bias)
        return out


# Kernels oneDNN compiles and keeps per shape met, in each of its two caches (oneDNN's own and ideep's, PyTorch's
# wrapper), instead of their default 1,024 entries of ~0.5 MB each.
KERNEL_CACHE_CAPACITY = 16


def limit_kernel_caches(capacity: int = KERNEL_CACHE_CAPACITY) -> None:
    """Bounds oneDNN's kernel caches for this process, unless the environment already does; takes effect only
    before its first oneDNN call.

    A bfloat16 or int8 assistant meets new product shapes every window (attention over prompts and drafts of
    every length), and each cached kernel holds memory: over the sonnets with `self:int8` a process grew by
    600 MB before the defaults filled, 270 MB with 64 entries, less again with 16, at the same speed
    (docs/precision.md).
    """
    for name in ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY"):
        os.environ.setdefault(name, str(capacity))


def use_onednn(module: torch.nn.Module) -> torch.nn.Module:
    """Makes every plain `nn.Linear` inside `module` a `OneDnnLinear` (in place: the class only); returns it."""
    for child in module.modules():
        if type(child) is torch.nn.Linear:
            child.__class__ = OneDnnLinear
    return module


def use_cpu_kernels(model: torch.nn.Module, pack_head: bool = True) -> torch.nn.Module:
    """`use_onednn` over a loaded model, and its output head packed (`OneDnnLinear.pack`) if `pack_head`;
    returns it."""
    use_onednn(model)
    head = model.get_output_embeddings()
    if pack_head and isinstance(head, OneDnnLinear):
        head.pack()
    return model


class Attention:
    """`attention(q, k, v, mask=None)` for `[batch, heads, rows, head_dim]` tensors, softmax scale 1/sqrt(d).

    On a CPU it is product, softmax, product over keys and values that `prepare` lays out once for all steps
    (the cross-attention's: a product over a strided operand copies it, 1,500 rows a call). SDPA's CPU kernel is
    made for many query rows: with a few it made base's decoder pass slower in float32 and a call several times
    slower in bfloat16 (docs/precision.md). PyTorch's bfloat16 batched products are slow for one row too (a third
    of an int8 draft's step), so a bfloat16 or int8 decoder keeps its keys and values in float32 and multiplies
    them there, rounding only the result back; except where `exact_rows` asks that each query row get the bits
    it would get alone (the int8 model, whose check of drafts must give a one-token step's logits): float32
    products over several rows sum in another order than over one, bfloat16's do not. Where `decoding.kernels.native` is
    built (and not `onednn_only()`), cross-attention keys and values are kept in float32 in their own layout and
    a few query rows attend over them through its kernels, which stream each once and compute each row on its own
    (so the int8 model takes them for every pass). On other devices it is SDPA in the model's precision.
    """

    def __init__(self, device: torch.device, exact_rows: bool = False) -> None:
        self.plain = not _REFERENCE.get() and device.type == "cpu"
        self.exact_rows = exact_rows
        # Decided once, as the layout `prepare` gives depends on it.
        self.native = self.plain and native_rows_allowed()

    def dtype(self, model_dtype: torch.dtype) -> torch.dtype:
        """The precision keys and values are kept in for a decoder computing in `model_dtype`."""
        return torch.float32 if self.plain and not self.exact_rows else model_dtype

    def prepare(self, x: torch.Tensor, keys: bool = True) -> torch.Tensor:
        """Keys or values read by many calls, laid out as `__call__(..., ready=True)` takes them."""
        if not self.plain:
            return x
        if self.native:
            return x.to(torch.float32).contiguous()
        return (x.transpose(-1, -2) if keys or self.exact_rows else x).to(self.dtype(x.dtype)).contiguous()

    def weights(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        """The attention weights `[batch, heads, rows, keys]` (float32) of `q` over keys laid out by `prepare`."""
        keys = k.float() if self.plain and not self.native else k.float().transpose(-1, -2)
        return ((q.float() * q.shape[-1] ** -0.5) @ keys).softmax(-1)

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None,
                 ready: bool = False) -> torch.Tensor:
        """Within `prompt_pass()` (the pass that fills an empty cache, the same in plain and assisted decoding)
        `exact_rows` need not compute its rows one by one."""
        prompt = in_prompt_pass()
        if not self.plain:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        if ready and self.native:
            scaled = (q.to(torch.float32) * q.shape[-1] ** -0.5).contiguous()
            # Each row on its own whatever the row count, so `exact_rows` takes it for every pass after the prompt.
            if mask is None and (q.shape[-2] <= native.MAX_ROWS or self.exact_rows and not prompt):
                return native.attention(scaled, k, v).to(q.dtype)
            # A prompt's many rows: torch's products over the keys and values as they lie.
            scores = scaled @ k.transpose(-1, -2)
            if mask is not None:
                scores = scores + mask if mask.dtype != torch.bool else scores.masked_fill(~mask, -torch.inf)
            return (scores.softmax(-1) @ v).to(q.dtype)
        if self.native and self.exact_rows and not prompt and k.dtype == torch.float32 and mask is not None \
                and mask.dtype == torch.bool:
            # A float32 row-exact decoder's self-attention (the int8 model's) over its fixed span of slots: each
            # row on its own through the native kernels, as its cross-attention.
            return native.attention((q * q.shape[-1] ** -0.5).contiguous(), k, v, mask).to(q.dtype)
        scores = (q.to(k.dtype) * q.shape[-1] ** -0.5).contiguous() @ (k if ready else k.transpose(-1, -2))
        if mask is not None:
            scores = scores + mask if mask.dtype != torch.bool else scores.masked_fill(~mask, -torch.inf)
        weights = scores.softmax(-1)
        if not self.exact_rows:
            return (weights @ v).to(q.dtype)
        # values.T @ weights.T: each query row's sum over the keys then runs in the same order whatever the
        # number of rows (weights @ values switches kernels between one row and several, and rounds differently).
        return ((v if ready else v.transpose(-1, -2).contiguous()) @ weights.transpose(-1, -2)).transpose(-1, -2)
