"""Model precisions a user picks with `--dtype` (faster-whisper's `compute_type`), and the int8 model.

`int8` is weight-only int8 for the decoder's linear layers (one scale per output row, the kernel of the
`self:int8` drafts), with activations, norms and the key/value buffers in float32 where `decoding.kernels.native` is
built, else bfloat16 (`int8_activations`), the token table in bfloat16, and the encoder in bfloat16: its
1,500-row products are compute-bound, where int8 weights bring nothing and bfloat16 (AVX512-BF16 / AMX) halves
the time. The output head is the token table itself, multiplied in float32 (`decoding.kernels.products.WidenedLinear`),
which greedy decoding screens through an int8 copy as it does a float32 head: a step reads the bytes of an int8
head, and the words are the bfloat16 head's (an int8 head cost WER, docs/precision.md). Without
`decoding.kernels.native` the head is int8 too. Every int8 product is the same for a row whichever rows are computed
with it, so assisted decoding checks drafts with the same numbers greedy decoding would produce.
"""

from __future__ import annotations

import logging

import torch

from decoding.kernels.products import native_bfloat16

logger = logging.getLogger(__name__)

INT8 = "int8"
# What `load_model` takes: a torch dtype, or INT8.
Precision = torch.dtype | str
NAMES = ("auto", "float32", "float16", "bfloat16", INT8)


def cpu_precisions() -> list[str]:
    """The `--dtype` names this machine's CPU runs: bfloat16 only where it is native."""
    return ["float32", *(["bfloat16"] if native_bfloat16() else []), INT8]


def resolve_precision(name: str, device: str) -> Precision:
    """The precision `--dtype NAME` means on `device` (cpu, cuda, mps).

    auto: float32 on a CPU, float16 elsewhere.

    Raises:
        ValueError: an unknown name, int8 off the CPU, or bfloat16 on a CPU that cannot compute it natively.
    """
    if name not in NAMES:
        raise ValueError(f"unknown dtype {name!r}; choose one of {', '.join(NAMES)}")
    if name == "auto":
        return torch.float32 if device == "cpu" else torch.float16
    if name == INT8:
        if device != "cpu":
            raise ValueError(f"int8 runs on the CPU only (PyTorch's int8 CPU kernels); on {device} use float16 "
                             "or bfloat16")
        return INT8
    if name == "bfloat16" and device == "cpu" and not native_bfloat16():
        raise ValueError("this CPU has no native bfloat16 (AVX512-BF16 or AMX): use float32 or int8")
    if name == "float16" and device == "cpu":
        raise ValueError("float16 is for GPUs; on a CPU use float32, bfloat16 or int8")
    return getattr(torch, name)


def load_dtype(precision: Precision) -> torch.dtype:
    """The dtype a model is loaded in before `quantize_model` (float32 for int8)."""
    return torch.float32 if precision == INT8 else precision


def compute_dtype(precision: Precision) -> torch.dtype:
    """The dtype a loaded assistant runs in beside a model of `precision`: bfloat16 for int8 (its encoder's dtype;
    the int8 decoder's own activations are `int8_activations()`)."""
    return torch.bfloat16 if precision == INT8 else precision


def pack_decoder(model: torch.nn.Module) -> torch.nn.Module:
    """Keeps the decoder's weights in oneDNN's packed layout as well (in place; returns it): for a bfloat16 model on
    a CPU a pass then costs less (docs/precision.md), for a second copy of the decoder's weights. In float32 it
    gains nothing for one token: there `pack_for_rows` packs only where passes carry several rows.

    Packed bfloat16 products are still not row-independent for every row count (fc2's, over 2,048 inputs, differ
    between 1 and 5 rows), so assisted decoding over a bfloat16 model is exact only up to such rounding."""
    from decoding.kernels.products import OneDnnLinear

    for module in model.get_decoder().modules():
        if isinstance(module, OneDnnLinear):
            module.pack()
    return model


# The largest float32 decoder (its layers' weights) that `pack_for_rows` gives a packed copy: tiny to small.
PACK_FOR_ROWS_LIMIT = 512 * 2**20
# The largest int8 decoder (its layers' int8 weights) whose bfloat16 copy, twice that, `quantize_model` keeps: tiny
# to small (see there).
KEEP_DEQUANTIZED_LIMIT = 128 * 2**20


def pack_for_rows(model: torch.nn.Module) -> bool:
    """Packs a float32 decoder's layers in oneDNN's layout too (in place; returns whether they are packed), for
    passes of several rows: a check of drafts, batched windows, beams. Over dense float32 weights oneDNN's
    products of a few rows cost much more than of one (base, a check of 3 drafts: ~25 against ~19 ms a pass);
    packed, about the same as one, while one-row steps are unchanged (docs/precision.md). Not for decoders over
    `PACK_FOR_ROWS_LIMIT` (the copy is as large as the layers: 84 MB for base, 2.9 GB for large-v3), offloaded
    ones (their layers are fetched per pass), or other precisions (bfloat16 ones are packed at loading)."""
    from asr.models.offload import offload_store
    from decoding.kernels.products import OneDnnLinear

    decoder = model.get_decoder()
    linears = [m for m in decoder.layers.modules() if isinstance(m, OneDnnLinear) and m.weight.dtype == torch.float32]
    size = sum(m.weight.numel() * m.weight.element_size() for m in linears)
    if not linears or size > PACK_FOR_ROWS_LIMIT or offload_store(model) is not None:
        return False
    pack_decoder(model)
    return all(module.packed is not None for module in linears)


def int8_activations() -> torch.dtype:
    """The int8 model's decoder activations: float32 where `decoding.kernels.native` is built (its int8 products take
    float32 rows at the int8 weights' speed, and its attention keeps each row on its own), else bfloat16
    (PyTorch's int8 kernel and row-exact bfloat16 attention)."""
    from decoding.kernels.products import native_rows_allowed

    return torch.float32 if native_rows_allowed() else torch.bfloat16


@torch.no_grad()
def is_int8_model(model: torch.nn.Module) -> bool:
    """Whether `model` is an int8 model (`quantize_model`): its decoder layers' products in int8."""
    from decoding.kernels.int8 import Int8Linear

    return any(isinstance(m, Int8Linear) for m in model.get_decoder().layers.modules())


def quantize_model(model: torch.nn.Module) -> torch.nn.Module:
    """Makes a float32 Whisper model the int8 model described above (in place); returns it."""
    from asr.models.int8 import keep_dequantized_within, quantize_linears
    from decoding.kernels.int8 import Int8Linear
    from decoding.kernels.products import WidenedLinear

    decoder = model.get_decoder()
    dtype = int8_activations()
    if dtype != torch.float32:
        # The head is tied to the token embedding: quantised from the float32 rows before they are rounded.
        model.proj_out = Int8Linear(model.get_output_embeddings(), dtype)
    for layer in decoder.layers:
        quantize_linears(layer, dtype)
    # Passes of many rows (each window's prompt, its cross-attention keys and values, the word-alignment pass)
    # multiply bfloat16 copies of the int8 weights. Made per call, they took a quarter of those passes' time (base,
    # a live update: 25 ms of the prompt's and the alignment's ~100); kept, a second copy of the layers (50 MB for
    # base, 230 MB for small; not for medium or large, 0.8-1.7 GB), made at the first such pass.
    keep_dequantized_within(decoder.layers, KEEP_DEQUANTIZED_LIMIT)
    decoder.to(dtype)
    decoder.embed_tokens.to(torch.bfloat16)  # rows looked up are widened exactly (WhisperDecoderAdapter)
    if dtype == torch.float32:
        # The head is the rounded table itself (tied: one tensor), screened through int8 by greedy decoding.
        model.proj_out = WidenedLinear(decoder.embed_tokens.weight)
    model.get_encoder().to(torch.bfloat16)
    # Every decoder pass attends over all key slots (`asr.whisper.decoder.WhisperDecoderAdapter`): a row's logits are then
    # the same bits in a one-token step and in a check of drafts.
    model.attention_span = model.config.max_target_positions
    # Its cross-attention keys and values rounded to bfloat16 (its encoder computes in bfloat16): a native step
    # streams half the bytes of them, a sixth of its time (WhisperDecoderAdapter, decoding.kernels.native_step).
    model.cross_attention_dtype = torch.bfloat16
    logger.debug("int8 decoder, %s head, bfloat16 encoder", type(model.proj_out).__name__)
    return model
