"""Greedy decoding's logits through a low-precision copy of a float32 output head, exact wherever the argmax can be.

A decoder step of Whisper `base` reads its 51,865 x 512 output head (106 MB in float32) for a handful of rows:
on a CPU, where a step is memory traffic, that is about 40 % of it. Greedy decoding needs one thing exactly, the
largest logit. So every logit is computed through a low-precision copy of the head, each with a proven bound on
its error, and every logit that could still be the largest is computed again in float32 from the float32 rows:
the argmax is float32's. Logits of the ids a caller names (`exact_ids`) are float32 too, whatever their values.
A head of bfloat16 weights multiplied in float32 (`products.WidenedLinear`, the int8 model's) is screened the
same way, its widened weights standing for the float32 rows.

Up to three rows (a step, a check of one or two drafts) go through `native`'s kernels where they are built, over an
int8 copy with one scale per row (a quarter of the bytes): float32 h times the int8 row widened
exactly, summed in float32, times the row's scale. For a head row w, its int8 form w8 = scale * q and `a` the
result as computed,

    |h.w - a| <= |h| (|w - w8| + gamma_d |w8|) + 2^-24 |a|       (row by row)

(Cauchy-Schwarz over the weight's rounding, float32 accumulation over d terms, the scale's product), and a
logit is computed again where its upper bound reaches the largest lower bound. More rows (a prompt, a long check)
go through oneDNN over a bfloat16 copy (hb the row's bfloat16 rounding, wb the weight's):

    |h.w - a| <= |h - hb| |w| + |hb| |w - wb| + gamma_d |hb| |wb| + 2^-8 (1 + 2^-7) |a|

with |w|, |w - wb|, |wb| the largest over the head's rows (the product's rounding to bfloat16 the last term).

What the result promises, and what decoding's filters may therefore do with it: after masking any of `exact_ids`
and either all or none of the other ids, and comparing values against the largest of the others (Whisper's
timestamp rule), the argmax is the float32 head's argmax. The logits of the other ids are within their bound of
float32's, so probabilities (a window's average log-probability) are close to float32's, not equal. Sampling and
beam search, which read the whole distribution, use the float32 head.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable, Sequence

import torch

from decoding.kernels import native
from decoding.kernels.products import WidenedLinear, linear, native_rows_allowed, screening_allowed

# bfloat16 keeps 8 significant bits: rounding a value moves it by at most 2^-8 of its size (the extra 2^-7 of that
# bounds it by the rounded value's size instead of the exact one's).
_ROUNDING = 2.0 ** -8 * (1 + 2.0 ** -7)
# Up to this many rows the int8 screen is the faster (docs/figures/screened-head.md: 1.3-2.5 ms for 1-3 rows of
# base's head); at four, oneDNN's bfloat16 product, recomputing fewer logits, is (2.6 against 3.2 ms).
_INT8_ROWS = 3


class HeadScreen:
    """The int8 and bfloat16 copies of one head's weights and the norms their error bounds need, each made when
    first needed; made once per head (`screened_head`), read by `ScreenedHead`s of any `exact_ids`. The weights are
    float32, or bfloat16 whose values widened are the head's (`WidenedLinear`: then they are their own bfloat16
    copy, with no rounding to bound)."""

    def __init__(self, weight: torch.Tensor) -> None:
        self.weight = weight.detach()
        width = weight.shape[1]
        # Accumulating `width` products in float32 (each exact: two 8-bit significands fit in 24), twice over for
        # kernels that sum partial sums in a different order.
        u = 2.0 ** -24
        self.gamma = 2 * width * u / (1 - width * u)
        self._heads: dict[tuple[int, ...], ScreenedHead] = {}

    @functools.cached_property
    def quantized(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The int8 copy `q` packed for `native.rowdot_packed` (`native.pack`: 1.1-1.3x as fast as the rows as
        stored for one or two rows, docs/precision.md), its scales (one per row) and each row's bound factor
        `|w - w8| + (gamma_d + 2^-23) |w8|` (the scale's rounding folded in, as |a| <= |h| |w8| nearly; 2^-8 more to
        spare for the float32 rounding of these norms), made when first needed."""
        weight = self.weight.float()
        scale = (weight.abs().amax(1) / 127).clamp_min(torch.finfo(torch.float32).tiny)
        q = torch.round(weight / scale[:, None]).clamp(-127, 127).to(torch.int8)
        dequantized = q.float() * scale[:, None]
        bound = ((weight - dequantized).norm(dim=1) + (self.gamma + 2.0 ** -23) * dequantized.norm(dim=1))
        return native.pack(q), scale.contiguous(), bound * (1 + 2.0 ** -8)

    @functools.cached_property
    def low(self) -> torch.Tensor:
        """The bfloat16 copy for several rows, made when first needed."""
        return self.weight if self.weight.dtype == torch.bfloat16 else self.weight.to(torch.bfloat16)

    @functools.cached_property
    def norms(self) -> tuple[float, float, float]:
        """The bfloat16 bound's norms: the largest |w|, |wb| and |w - wb| over the rows."""
        weight, low = self.weight.float(), self.low.float()
        return (float(weight.norm(dim=1).max()), float(low.norm(dim=1).max()),
                float((weight - low).norm(dim=1).max()))

    @functools.cached_property
    def product(self) -> Callable[[torch.Tensor], torch.Tensor]:
        """oneDNN's product over a packed copy of `low`, made when first needed (several rows, or no
        `decoding.kernels.native`): over that layout its products stream the weights fastest (docs/precision.md)."""
        return linear(self.low, None, torch.ops.mkldnn._reorder_linear_weight(self.low))

    def head(self, exact_ids: Sequence[int]) -> "ScreenedHead":
        key = tuple(sorted(set(int(i) for i in exact_ids)))
        if key not in self._heads:
            self._heads[key] = ScreenedHead(self, key)
        return self._heads[key]


class ScreenedHead:
    """`h -> logits` (`[..., d]` float32 -> `[..., V]` float32) as described in the module's docstring."""

    def __init__(self, screen: HeadScreen, exact_ids: Sequence[int]) -> None:
        self.screen = screen
        self.exact_ids = torch.tensor(list(exact_ids), dtype=torch.long)
        rows = screen.weight[self.exact_ids].float().contiguous()
        self.exact_product = (linear(rows, None, torch.ops.mkldnn._reorder_linear_weight(rows))
                              if self.exact_ids.numel() else None)
        # How many logits the last calls computed again in float32 (not counting exact_ids), for measurements.
        self.refined = 0

    def __call__(self, h: torch.Tensor) -> torch.Tensor:
        screen = self.screen
        if h.numel() == 0:  # a pass that only fills the cache (an English-only model's prompt ends in its start)
            return h.new_empty(*h.shape[:-1], screen.weight.shape[0], dtype=torch.float32)
        flat = h.reshape(-1, h.shape[-1]).float()
        if len(flat) <= _INT8_ROWS and native_rows_allowed():
            packed, scale, row_bound = screen.quantized
            logits = native.rowdot_packed(flat, packed, len(scale), None, scale)
            if self.exact_product is not None:
                logits[:, self.exact_ids] = -torch.inf  # out of the search below; computed in float32 after it
            bound = flat.norm(dim=-1, keepdim=True) * row_bound
            lowest_top = (logits - bound).amax(-1, keepdim=True)
            rows, ids = (logits + bound >= lowest_top).nonzero(as_tuple=True)
        else:
            weight_norm, low_norm, rounding_norm = screen.norms
            low = flat.to(torch.bfloat16)
            logits = screen.product(low).float()
            low32 = low.float()
            # The bound's part shared by a row's logits; the rest is _ROUNDING of each logit's own size.
            shared = ((flat - low32).norm(dim=-1, keepdim=True) * weight_norm
                      + low32.norm(dim=-1, keepdim=True) * (rounding_norm + screen.gamma * low_norm))
            if self.exact_product is not None:
                logits[:, self.exact_ids] = -torch.inf
            # x - _ROUNDING |x| and x + _ROUNDING |x| both grow with x: the best lower bound is the largest logit's,
            # and a logit's upper bound reaches it exactly when the logit reaches one threshold.
            top = logits.amax(-1, keepdim=True)  # the values alone: ~10x cheaper than max()'s values and indices
            reach = top - _ROUNDING * top.abs() - 2 * shared
            threshold = torch.where(reach >= 0, reach / (1 + _ROUNDING), reach / (1 - _ROUNDING))
            rows, ids = (logits >= threshold).nonzero(as_tuple=True)
        self.refined += int(rows.numel())
        logits[rows, ids] = (flat[rows] * screen.weight[ids].float()).sum(-1)
        if self.exact_product is not None:
            logits[:, self.exact_ids] = self.exact_product(flat)
        return logits.view(*h.shape[:-1], -1)


# Per loaded head module, its screen (kept off the module, whose copies and pickles cannot hold oneDNN's layout).
_SCREENS: weakref.WeakKeyDictionary[torch.nn.Module, HeadScreen] = weakref.WeakKeyDictionary()


def screened_head(head: torch.nn.Module, exact_ids: Sequence[int]) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """The screened form of a loaded model's output head (`head`: an `nn.Linear` of float32 weights, or a
    `WidenedLinear`), or None where it does not apply: another precision, a bias, a device other than the CPU, a
    CPU without native bfloat16, PyTorch's reference kernels or `full_head()` (`decoding.kernels`). The screen is
    made on first use and kept for `head`."""
    weight = getattr(head, "weight", None)
    exact_dtype = torch.bfloat16 if isinstance(head, WidenedLinear) else torch.float32
    if (weight is None or getattr(head, "bias", None) is not None or weight.dtype != exact_dtype
            or weight.device.type != "cpu" or not screening_allowed()):
        return None
    screen = _SCREENS.get(head)
    if screen is None or screen.weight.data_ptr() != weight.data_ptr():
        screen = _SCREENS[head] = HeadScreen(weight)
    return screen.head(exact_ids)
