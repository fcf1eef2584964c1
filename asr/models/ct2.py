"""Read CTranslate2 ``model.bin`` files as plain data.

The layout is little-endian::

    u32 version, str spec, u32 revision, u32 n_variables,
    n_variables x (str name, u8 rank, rank x u32 dim, u8 dtype, u32 n_bytes, n_bytes raw),
    u32 n_aliases, n_aliases x (str alias, str target)

where ``str`` is a ``u16`` length that counts a trailing NUL, then the bytes. Every length and size is
checked against the file before it is used, so a damaged file raises :class:`ModelFileError` with one
line that names the file, never another exception and never a silently wrong tensor.
"""

from __future__ import annotations

import logging
import math
import os
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

logger = logging.getLogger(__name__)

#: Binary versions this reader understands (the layout above is version 6's).
SUPPORTED_VERSIONS = (6,)
#: Largest rank accepted; Whisper's variables have rank <= 3.
MAX_RANK = 8

#: CTranslate2 dtype code -> torch dtype (0 f32, 1 i8, 2 i16, 3 i32, 4 f16, 5 bf16).
DTYPES: dict[int, torch.dtype] = {
    0: torch.float32,
    1: torch.int8,
    2: torch.int16,
    3: torch.int32,
    4: torch.float16,
    5: torch.bfloat16,
}

PathLike = str | os.PathLike


class ModelFileError(ValueError):
    """A model file is missing, truncated, or not a CTranslate2 file this reader understands."""


#: Why a model folder whose weights and config.json disagree is refused (transformers would fill the gaps with
#: random values).
WEIGHTS_UNLIKE_CONFIG = "the weights do not hold the tensors its config.json names, in their shapes"


@dataclass(frozen=True)
class Ct2File:
    """The contents of one ``model.bin``.

    Attributes:
        path: The file (or first part) it was read from, for messages.
        spec: Model spec name, e.g. ``"WhisperSpec"``.
        version: Binary format version.
        revision: Spec revision.
        variables: Name -> tensor, stored variables and aliases both (an alias maps to its target's tensor).
        aliases: Alias name -> target name, as stored.
    """

    path: str
    spec: str
    version: int
    revision: int
    variables: dict[str, torch.Tensor] = field(repr=False)
    aliases: dict[str, str]


class _Reader:
    """Bounds-checked little-endian cursor over a byte buffer."""

    def __init__(self, buf: bytearray, name: str) -> None:
        self.buf = buf
        self.view = memoryview(buf)
        self.pos = 0
        self.name = name

    def fail(self, what: str) -> ModelFileError:
        return ModelFileError(f"{self.name}: {what} (at byte {self.pos} of {len(self.buf)})")

    def take(self, n: int, what: str) -> memoryview:
        if n < 0 or self.pos + n > len(self.buf):
            raise self.fail(f"file ends inside {what}: needs {n} bytes, {len(self.buf) - self.pos} left")
        out = self.view[self.pos : self.pos + n]
        self.pos += n
        return out

    def u8(self, what: str) -> int:
        return self.take(1, what)[0]

    def u16(self, what: str) -> int:
        return struct.unpack("<H", self.take(2, what))[0]

    def u32(self, what: str) -> int:
        return struct.unpack("<I", self.take(4, what))[0]

    def string(self, what: str) -> str:
        n = self.u16(f"length of {what}")
        if n == 0:
            raise self.fail(f"{what} has length 0 (a string counts its trailing NUL)")
        raw = bytes(self.take(n, what))
        if raw[-1] != 0:
            raise self.fail(f"{what} is not NUL-terminated")
        if 0 in raw[:-1]:
            raise self.fail(f"{what} contains a NUL byte before its end")
        try:
            return raw[:-1].decode("utf-8")
        except UnicodeDecodeError:
            raise self.fail(f"{what} is not valid UTF-8") from None


def _physical_memory() -> float:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not a POSIX system: the allocation decides
        return math.inf


def _read_parts(paths: Sequence[Path], name: str) -> bytearray:
    """Reads one or more files, in order, into a single buffer (no concatenated copy on disk)."""
    try:
        sizes = [p.stat().st_size for p in paths]
        total = sum(sizes)
        too_big = ModelFileError(f"{name}: {total / 2 ** 30:.1f} GiB do not fit in this machine's memory")
        if total > _physical_memory():  # a sparse file, say: refused before any allocation or read
            raise too_big
        try:
            buf = bytearray(total)
        except MemoryError:
            raise too_big from None
        view = memoryview(buf)
        pos = 0
        for path, size in zip(paths, sizes):
            with open(path, "rb") as f:
                got = f.readinto(view[pos : pos + size])
            if got != size:
                raise ModelFileError(f"{path}: read {got} bytes, expected {size} (file changed while reading?)")
            pos += size
    except OSError as e:
        raise ModelFileError(f"{name}: cannot read: {e.strerror or e}") from None
    return buf


# Elements a tensor's shape may describe (torch computes strides in 64-bit integers).
_MAX_ELEMENTS = 2 ** 62


def _read_tensor(r: _Reader, name: str) -> torch.Tensor:
    rank = r.u8(f"rank of {name!r}")
    if rank > MAX_RANK:
        raise r.fail(f"variable {name!r} has rank {rank} (at most {MAX_RANK} expected)")
    dims = tuple(r.u32(f"dimensions of {name!r}") for _ in range(rank))
    if math.prod(d for d in dims if d) > _MAX_ELEMENTS:  # even an empty tensor's strides must fit in 64 bits
        raise r.fail(f"variable {name!r} has dimensions {list(dims)}: more elements than any tensor can hold")
    code = r.u8(f"dtype of {name!r}")
    if code not in DTYPES:
        raise r.fail(f"variable {name!r} has unknown dtype code {code} (known: {sorted(DTYPES)})")
    dtype = DTYPES[code]
    n_bytes = r.u32(f"byte count of {name!r}")
    expected = math.prod(dims) * dtype.itemsize
    if n_bytes != expected:
        raise r.fail(f"variable {name!r} {list(dims)} {dtype} declares {n_bytes} bytes, shape needs {expected}")
    offset = r.pos
    raw = r.take(n_bytes, f"data of {name!r}")
    if n_bytes == 0:
        return torch.empty(dims, dtype=dtype)
    # A view shares the file's buffer (no copy); data that is not aligned to its item size is copied.
    tensor = torch.frombuffer(raw, dtype=dtype).reshape(dims)
    return tensor if offset % dtype.itemsize == 0 else tensor.clone()


def read_ct2(path: PathLike | Sequence[PathLike]) -> Ct2File:
    """Reads a CTranslate2 ``model.bin``.

    Args:
        path: The file, or its parts in order (``model.bin.part1``, ``model.bin.part2``), which are read
            back to back into one buffer as if concatenated.

    Returns:
        The spec name, version, revision, variables (aliases resolved) and aliases.

    Raises:
        ModelFileError: A file is missing or unreadable, or any length, size, rank, dtype code or string
            is inconsistent, or bytes are left after the aliases.
    """
    paths = [Path(path)] if isinstance(path, (str, os.PathLike)) else [Path(p) for p in path]
    if not paths:
        raise ModelFileError("read_ct2: no file given")
    name = str(paths[0]) if len(paths) == 1 else f"{paths[0]} (+{len(paths) - 1} parts)"
    r = _Reader(_read_parts(paths, name), name)

    version = r.u32("version")
    if version not in SUPPORTED_VERSIONS:
        raise r.fail(f"unsupported CTranslate2 binary version {version} (supported: {SUPPORTED_VERSIONS})")
    spec = r.string("spec name")
    revision = r.u32("spec revision")
    n_variables = r.u32("variable count")
    variables: dict[str, torch.Tensor] = {}
    for i in range(n_variables):
        var = r.string(f"name of variable {i}")
        if not var:
            raise r.fail(f"variable {i} has an empty name")
        if var in variables:
            raise r.fail(f"variable {var!r} appears twice")
        variables[var] = _read_tensor(r, var)

    n_aliases = r.u32("alias count")
    aliases: dict[str, str] = {}
    for i in range(n_aliases):
        alias = r.string(f"name of alias {i}")
        target = r.string(f"target of alias {alias!r}")
        if alias in variables or alias in aliases:
            raise r.fail(f"alias {alias!r} clashes with another variable or alias")
        if target not in variables:
            raise r.fail(f"alias {alias!r} points to missing variable {target!r}")
        aliases[alias] = target
    if r.pos != len(r.buf):
        raise r.fail(f"{len(r.buf) - r.pos} unexpected bytes after the aliases")

    for alias, target in aliases.items():
        variables[alias] = variables[target]
    logger.debug("read %s: %s v%d rev %d, %d variables, %d aliases", name, spec, version, revision,
                 n_variables, n_aliases)
    return Ct2File(path=name, spec=spec, version=version, revision=revision, variables=variables,
                   aliases=aliases)
