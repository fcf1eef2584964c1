"""Weight-only int8 Linear layers for decoders on a CPU: the layer the `--dtype int8` model and the int8 drafts
are made of (`asr.models.int8` quantises a model's layers into them).

Each output row keeps its own scale (per-channel, as gpt-fast's int8 weight-only mode) and the activations
stay in float or bfloat16, so a copy agrees with the fp32 model more often than PyTorch's dynamic quantisation,
which also rounds the activations to int8 with one scale per tensor. The kernel computes each row on its own: a
row's result does not depend on the rows beside it, so checking drafts in one pass gives greedy decoding's
numbers. For float32 activations (the `--dtype int8` model and the int8 drafts where `decoding.kernels.native` is
built) that kernel is native's `rowdot_i8` (the weights widened as they are read, sums in float32), which at one
row reads the int8 weights about twice as fast as PyTorch's `_weight_int8pack_mm`, the kernel for bfloat16
activations.
"""

from __future__ import annotations

import torch

from decoding.kernels import native
from decoding.kernels.products import linear, native_rows_allowed, row_by_row

_ROWS = 4096


class Int8Linear(torch.nn.Module):
    """`y = x @ (scale * W_int8).T + b`, with `x` in `dtype` (bfloat16)."""

    def __init__(self, linear: torch.nn.Linear, dtype: torch.dtype = torch.bfloat16) -> None:
        super().__init__()
        weight = linear.weight.detach()
        quantized = torch.empty(weight.shape, dtype=torch.int8)
        scale = torch.empty(weight.shape[0])
        # In blocks of rows, so that quantising a large head (51,865 x 1,280 in large-v3) never holds float copies
        # of the whole matrix; each row's scale and values are the same as in one go.
        for start in range(0, weight.shape[0], _ROWS):
            rows = weight[start:start + _ROWS].float()
            block = rows.abs().amax(dim=1).clamp_min(1e-12) / 127.0
            quantized[start:start + _ROWS] = torch.round(rows / block[:, None]).clamp(-127, 127).to(torch.int8)
            scale[start:start + _ROWS] = block
        self.register_buffer("weight", quantized)
        self.register_buffer("scale", scale.to(dtype))
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().to(dtype))
        self.in_features, self.out_features = linear.in_features, linear.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features).to(self.scale.dtype).contiguous()
        if not row_by_row(len(flat)):
            # The int8 kernels are made for a few rows; over an encoder output (cross-attention keys and values,
            # 1,500 rows) or a prompt the weights dequantised once and a bfloat16 product take a fraction of
            # their time.
            bias = None if self.bias is None else self.bias.to(torch.bfloat16)
            return linear(self._dequantized(), bias)(flat.to(torch.bfloat16)).to(self.scale.dtype).view(
                *x.shape[:-1], self.out_features)
        if self.scale.dtype == torch.float32 and flat.device.type == "cpu" and native_rows_allowed():
            # Scales, bias and rows are float32 already: nothing to convert.
            return native.rowdot(flat, self.weight, self.bias, self.scale).view(*x.shape[:-1], self.out_features)
        y = torch.ops.aten._weight_int8pack_mm(flat, self.weight, self.scale)
        if self.bias is not None:
            y = y + self.bias
        return y.view(*x.shape[:-1], self.out_features)

    def keep_dequantized(self) -> None:
        """Keeps the bfloat16 weights that products of many rows use (twice the int8 weight's memory) instead of
        dequantising them per call: for a small drafting copy, whose prompt pass every window otherwise spends
        most of its time there (base-draft:int8: 26 ms for a 169-token prompt)."""
        self._keep = True

    def _dequantized(self) -> torch.Tensor:
        kept = self.__dict__.get("_kept")
        if kept is not None:
            return kept
        weight = (self.weight.to(self.scale.dtype) * self.scale[:, None]).to(torch.bfloat16)
        if self.__dict__.get("_keep"):
            self.__dict__["_kept"] = weight
        return weight

    def to_linear(self) -> torch.nn.Linear:
        """A plain Linear with the dequantised weights, in the activations' dtype."""
        linear = torch.nn.Linear(self.in_features, self.out_features, bias=self.bias is not None,
                                 device=self.weight.device, dtype=self.scale.dtype)
        with torch.no_grad():
            linear.weight.copy_(self.weight.to(self.scale.dtype) * self.scale[:, None])
            if self.bias is not None:
                linear.bias.copy_(self.bias)
        return linear
