"""Row-by-row products and attention for decoder steps on a CPU, compiled on this machine at first use
(`csrc/rowdot.c`; with it `csrc/encoder_attention.c`, a bfloat16 encoder's attention: `encoder_attention`).

A decoder step multiplies one to a few rows by every weight matrix and attends over 1,500 encoder frames, so its
time is reading weights, keys and values. oneDNN's and MKL's products for so few rows read a float32 weight at
10-15 GB/s on the 2-core machines measured, where one pass over memory reaches ~25 (docs/precision.md); a plain
loop in which each thread streams its own block of rows once, with four vector accumulators, reaches ~20-25, and
so do the attention kernels over keys and values laid out as they are. Every sum runs in one fixed order per row,
so a row's result is the same whatever rows are computed beside it.

The C files are compiled once per machine with the system's C compiler (`$CC`, else `cc`, `gcc` or `clang`;
`-O3 -march=native -fopenmp`) into the cache folder (`$ASSISTED_WHISPER_CACHE`, else
`$XDG_CACHE_HOME/assisted-whisper`, else `~/.cache/assisted-whisper`), under a name that hashes the sources, the
compiler and the CPU's flags. Without a compiler `library()` is None and the callers keep oneDNN (logged);
`decoding.kernels.products.onednn_only()` keeps oneDNN without building anything.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

logger = logging.getLogger(__name__)

SOURCES = tuple(Path(__file__).with_name("csrc") / name for name in ("rowdot.c", "encoder_attention.c"))
# Read by the sources (`#include`): part of what the library is built from, so part of its name.
HEADERS = (Path(__file__).with_name("csrc") / "vector_exp.h",)
VERSION = 10
# Up to this many activation rows a float32 product goes through these kernels (`decoding.kernels.products.linear`);
# beyond, their arithmetic starts to count and oneDNN's blocked products win (docs/precision.md).
MAX_ROWS = 4


def _cache_root() -> Path:
    """The folder `asr.models.cache.cache_dir` names (decoding/ does not import asr/)."""
    explicit = os.environ.get("ASSISTED_WHISPER_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "assisted-whisper"


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return platform.processor()


def _compiler() -> str | None:
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def _build(compiler: str, target: Path) -> None:
    """Compiles the sources into `target` through a temporary file renamed into place (processes may race)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=target.parent, suffix=".so.tmp")
    os.close(handle)
    try:
        subprocess.run([compiler, "-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", *map(str, SOURCES),
                        "-lm", "-o", temporary], check=True, capture_output=True, timeout=120)
        os.replace(temporary, target)
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)


@functools.lru_cache(maxsize=None)
def library() -> ctypes.CDLL | None:
    """The compiled kernels (built now if needed), or None where they cannot be had (not Linux, no C compiler,
    a failed build: logged once)."""
    if platform.system() != "Linux":
        return None
    compiler = _compiler()
    if compiler is None:
        logger.info("no C compiler found: decoder steps use oneDNN's products")
        return None
    try:
        sources = [source.read_bytes() for source in (*SOURCES, *HEADERS)]
        key = hashlib.sha256(b"\0".join([*sources, compiler.encode(), _cpu_flags().encode(),
                                         platform.machine().encode()])).hexdigest()[:16]
        target = _cache_root() / "native" / f"rowdot-{key}.so"
        if not target.exists():
            _build(compiler, target)
        lib = ctypes.CDLL(str(target))
        if lib.rowdot_version() != VERSION:
            raise OSError(f"{target} is version {lib.rowdot_version()}, expected {VERSION}")
    except (OSError, subprocess.SubprocessError) as error:
        detail = getattr(error, "stderr", b"") or b""
        logger.warning("native kernels unavailable (%s%s): decoder steps use oneDNN's products", error,
                       f": {detail.decode(errors='replace').strip().splitlines()[-1]}" if detail.strip() else "")
        return None
    for name in ("rowdot_f32", "rowdot_bf16"):
        function = getattr(lib, name)
        function.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int64] * 3 + [ctypes.c_int]
        function.restype = None
    lib.rowdot_i8.argtypes = [ctypes.c_void_p] * 5 + [ctypes.c_int64] * 3 + [ctypes.c_int]
    lib.rowdot_i8.restype = None
    lib.rowdot_packed.argtypes = [ctypes.c_void_p] * 5 + [ctypes.c_int64] * 4 + [ctypes.c_int]
    lib.rowdot_packed.restype = None
    for name in ("attention_scores", "attention_values"):
        function = getattr(lib, name)
        function.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int64] * 4 + [ctypes.c_int]
        function.restype = None
    lib.decoder_step.argtypes = ([ctypes.c_void_p] * 2 + [ctypes.c_int64] * 2 + [ctypes.c_void_p] * 4
                               + [ctypes.c_int64, ctypes.c_int])
    lib.decoder_step.restype = None
    lib.decoder_step_windows.argtypes = ([ctypes.c_void_p] * 5 + [ctypes.c_int64] * 2 + [ctypes.c_void_p] * 4
                                         + [ctypes.c_int])
    lib.decoder_step_windows.restype = None
    lib.encoder_attention.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int64] * 3 + [ctypes.c_float, ctypes.c_int]
    lib.encoder_attention.restype = ctypes.c_int
    return lib


# The structures `decoder_step` reads (csrc/rowdot.c): a decoder's weights as pointers, built once per window.
WEIGHT_KINDS = {torch.float32: 0, torch.bfloat16: 1, torch.int8: 2}


class StepLinear(ctypes.Structure):
    _fields_ = [("w", ctypes.c_void_p), ("scale", ctypes.c_void_p), ("bias", ctypes.c_void_p), ("n", ctypes.c_int64),
                ("k", ctypes.c_int64), ("kind", ctypes.c_int64), ("packed", ctypes.c_void_p)]


class StepLayer(ctypes.Structure):
    _fields_ = [("norm_self_w", ctypes.c_void_p), ("norm_self_b", ctypes.c_void_p), ("q", StepLinear),
                ("k", StepLinear), ("v", StepLinear), ("out", StepLinear), ("norm_cross_w", ctypes.c_void_p),
                ("norm_cross_b", ctypes.c_void_p),
                ("cross_q", StepLinear), ("cross_out", StepLinear), ("cross_k", ctypes.c_void_p),
                ("cross_v", ctypes.c_void_p), ("norm_ffn_w", ctypes.c_void_p), ("norm_ffn_b", ctypes.c_void_p),
                ("fc1", StepLinear), ("fc2", StepLinear)]


class StepModel(ctypes.Structure):
    _fields_ = [("layers", ctypes.c_int64), ("d", ctypes.c_int64), ("heads", ctypes.c_int64),
                ("frames", ctypes.c_int64), ("ffn", ctypes.c_int64), ("capacity", ctypes.c_int64),
                ("cross_kind", ctypes.c_int64), ("embed_kind", ctypes.c_int64),
                ("eps", ctypes.c_float), ("layer", ctypes.POINTER(StepLayer)), ("embed_tokens", ctypes.c_void_p),
                ("embed_positions", ctypes.c_void_p), ("norm_w", ctypes.c_void_p), ("norm_b", ctypes.c_void_p),
                ("window_k", ctypes.c_int64), ("window_v", ctypes.c_int64)]


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """softmax(q @ k.T) @ v for `[..., R, D]` float32 queries (already scaled) over `[..., T, D]` keys and values,
    contiguous, on a CPU; `mask` (boolean, broadcast to `[..., R, T]`) keeps the keys a row may see. `library()`
    built."""
    lib = library()
    *groups, rows, width = q.shape
    keys = k.shape[-2]
    count = q.numel() // (rows * width)
    q, k, v = (t.to(torch.float32).contiguous() for t in (q, k, v))  # no copies for what Attention prepares
    scores = torch.empty(*groups, rows, keys, dtype=torch.float32)
    threads = torch.get_num_threads()
    lib.attention_scores(q.data_ptr(), k.data_ptr(), scores.data_ptr(), count, rows, keys, width, threads)
    if mask is not None:
        scores.masked_fill_(~mask, -torch.inf)
    weights = scores.softmax(-1)
    out = torch.empty(*groups, rows, width, dtype=torch.float32)
    lib.attention_values(weights.data_ptr(), v.data_ptr(), out.data_ptr(), count, rows, keys, width, threads)
    return out


def rowdot(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
           scale: torch.Tensor | None = None) -> torch.Tensor:
    """`x @ weight.T + bias` in float32 for a CPU `x` (float32, or bfloat16 widened exactly) and a dense float32,
    bfloat16 or int8 `weight`, each weight widened exactly as it is read; an int8 weight's products are multiplied
    by `scale` (one per output row: `y = scale * (x @ weight.T) + bias`). `library()` built."""
    lib = library()
    if not weight.is_contiguous():
        weight = weight.contiguous()
    out_features, in_features = weight.shape
    x, bias, scale = _operands(x, in_features, weight.dtype, bias, scale)
    y = torch.empty(*x.shape[:-1], out_features)
    rows = x.numel() // in_features if in_features else 0
    threads = torch.get_num_threads()
    bias_pointer = bias.data_ptr() if bias is not None else None
    if scale is None:
        kernel = lib.rowdot_f32 if weight.dtype == torch.float32 else lib.rowdot_bf16
        kernel(x.data_ptr(), weight.data_ptr(), bias_pointer, y.data_ptr(), rows, out_features, in_features, threads)
    else:
        lib.rowdot_i8(x.data_ptr(), weight.data_ptr(), scale.data_ptr(), bias_pointer, y.data_ptr(), rows,
                      out_features, in_features, threads)
    return y


def _float32(t: torch.Tensor | None) -> torch.Tensor | None:
    return t if t is None or (t.dtype == torch.float32 and t.is_contiguous()) else t.to(torch.float32).contiguous()


def _operands(x: torch.Tensor, in_features: int, weight_dtype: torch.dtype, bias: torch.Tensor | None,
              scale: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """A product's rows, bias and scales as the kernels read them (float32, contiguous), checked against a weight of
    `in_features` inputs and `weight_dtype`. A step calls the products ~50 times, so this converts nothing it need
    not (each conversion costs microseconds)."""
    if x.shape[-1] != in_features:
        raise ValueError(f"input of {x.shape[-1]} features for a weight of {in_features}")
    if (weight_dtype == torch.int8) != (scale is not None):
        raise ValueError("an int8 weight needs its scales, and only an int8 weight takes them")
    return _float32(x), _float32(bias), _float32(scale)


# Outputs in a block of a packed weight (`PACK_N` in csrc/rowdot.c).
PACK_N = 64


def pack(weight: torch.Tensor) -> torch.Tensor:
    """A `[N, K]` weight (float32, bfloat16 or int8) as `packed_products` reads it: blocks of 64 outputs, k-major
    (`[ceil(N / 64), K, 64]`, zero past the last output)."""
    out_features, in_features = weight.shape
    padded = weight.new_zeros(-(-out_features // PACK_N) * PACK_N, in_features)
    padded[:out_features] = weight
    return padded.view(padded.shape[0] // PACK_N, PACK_N, in_features).transpose(1, 2).contiguous()


def rowdot_packed(x: torch.Tensor, packed: torch.Tensor, out_features: int, bias: torch.Tensor | None = None,
                  scale: torch.Tensor | None = None) -> torch.Tensor:
    """`rowdot`'s product over a `pack`ed weight (as a decoder step multiplies it), for `[M, K]` rows; `library()`
    built."""
    x, bias, scale = _operands(x, packed.shape[1], packed.dtype, bias, scale)
    rows, in_features = x.shape
    y = torch.empty(rows, out_features)
    library().rowdot_packed(x.data_ptr(), packed.data_ptr(), scale.data_ptr() if scale is not None else None,
                            bias.data_ptr() if bias is not None else None, y.data_ptr(), rows, out_features,
                            in_features, WEIGHT_KINDS[packed.dtype], torch.get_num_threads())
    return y
