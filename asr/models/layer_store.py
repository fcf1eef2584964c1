"""Offloaded decoder layers: their weights live on disk (or in CPU memory for a GPU) and come in per layer.

`WhisperDecoderAdapter` calls each layer's kernels directly, so accelerate's module hooks never fire on its
path; it asks a `LayerStore` for a layer's weights just before the layer runs and lets go of them after.
Each offloaded layer is one safetensors file in the offload folder, in the dtype the model runs in, so a
fetch is one read of a contiguous block (`preadv` into one of two reused buffers, the next layer read on a
background thread while the current one computes) or a memory map of the file (`mmap`), or, for
comparison, accelerate's own `OffloadedWeightsLoader` over the same files (`accelerate`).

The layer files stay open from the moment they are written: a folder deleted or cleaned mid-run takes nothing
the store still reads. A folder that fills up while they are written, or a file cut short under the store, is
an `OffloadError` (one line naming the folder), never a traceback or weights read from missing bytes.
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import mmap
import os
import shutil
import struct
import weakref
from collections.abc import Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import save_file

from asr.models.ct2 import ModelFileError

#: How an offloaded layer is read back (see the module docstring).
READERS = ("read", "mmap", "accelerate")

# safetensors' own limit on a header (its Rust reader refuses larger ones).
_MAX_HEADER = 100 * 2 ** 20
_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "I8": torch.int8,
           "F64": torch.float64, "I64": torch.int64, "I32": torch.int32, "U8": torch.uint8}


class OffloadError(ValueError):
    """Offload options that cannot be honoured for this model (too little memory for its resident parts), or an
    offload folder that fails under the store (full, its files cut short or unreadable)."""


def safetensors_header(path: Path) -> tuple[dict, int]:
    """The header of a safetensors file (name -> dtype, shape, data_offsets) and where its data starts, every
    entry checked against the file (safetensors' own rules), so nothing read later trusts a lie.

    Raises:
        ModelFileError: naming the file and what is wrong with it.
    """
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as handle:
            prefix = handle.read(8)
            (length,) = struct.unpack("<Q", prefix) if len(prefix) == 8 else (-1,)
            if not 0 < length <= min(size - 8, _MAX_HEADER):
                raise ModelFileError(f"{path}: not a safetensors file (its header length {length} does not fit "
                                     f"its {size} bytes)")
            header = json.loads(handle.read(length))
    except (ValueError, RecursionError) as error:  # not UTF-8, not JSON, nested beyond reason
        if isinstance(error, ModelFileError):
            raise
        raise ModelFileError(f"{path}: not a safetensors file (its header is not JSON)") from None
    if not isinstance(header, dict):
        raise ModelFileError(f"{path}: not a safetensors file (its header is not a JSON object)")
    header.pop("__metadata__", None)
    for name, entry in header.items():
        problem = _entry_problem(entry, size - 8 - length)
        if problem:
            raise ModelFileError(f"{path}: tensor {name[:80]!r} {problem}")
    return header, 8 + length


def _entry_problem(entry: object, data_size: int) -> str | None:
    """What makes one header entry unreadable, or None."""
    if not isinstance(entry, dict) or entry.get("dtype") not in _DTYPES:
        return f"has no dtype this reader knows ({', '.join(_DTYPES)})"
    shape, offsets = entry.get("shape"), entry.get("data_offsets")
    if not isinstance(shape, list) or len(shape) > 8 or not all(_whole(d) for d in shape):
        return "has no shape of at most 8 whole sizes"
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(_whole(o) for o in offsets) \
            or not offsets[0] <= offsets[1] <= data_size:
        return f"has data offsets {str(offsets)[:40]} outside the file's {data_size} bytes of data"
    if math.prod(shape) * _DTYPES[entry["dtype"]].itemsize != offsets[1] - offsets[0]:
        return f"has shape {shape} in {entry['dtype']}, which its {offsets[1] - offsets[0]} bytes do not hold"
    return None


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def read_tensor(handle, entry: dict, data_start: int) -> torch.Tensor:
    """One tensor of an open safetensors file, read into fresh memory (no memory map left behind)."""
    begin, end = entry["data_offsets"]
    out = torch.empty(entry["shape"], dtype=_DTYPES[entry["dtype"]])
    if end > begin:
        _read_exactly(handle.fileno(), out.view(-1).view(torch.uint8), data_start + begin)
    return out


def _read_exactly(fd: int, out: torch.Tensor, offset: int) -> None:
    """Fills the bytes of `out` from `fd` at `offset`; a file that ends sooner is an OSError, never stale bytes."""
    wanted = out.numel()
    got = os.preadv(fd, [memoryview(out.numpy())], offset)
    if got != wanted:
        raise OSError(errno.EIO, f"file cut short: {got} of {wanted} bytes at offset {offset}")


def map_tensors(path: Path, header: dict, data_start: int) -> dict[str, torch.Tensor]:
    """Every tensor of a safetensors file as a view of one private memory map of it: clean file pages, which the
    kernel may drop under memory pressure and read again, and which are not written back if a tensor is changed."""
    size = data_start + max((entry["data_offsets"][1] for entry in header.values()), default=0)
    data = torch.from_file(str(path), shared=False, size=size, dtype=torch.uint8)[data_start:]
    return _views(data, header)


class LayerStore:
    """The weights of the offloaded decoder layers, fetched one layer at a time onto the execution device.

    Args:
        folder: where the layer files go (disk offload), or None to keep them in CPU memory (GPU execution).
        device: where the layers run.
        reader: one of READERS (disk offload).
        prefetch: read the next offloaded layer while the current one computes.
        drop_page_cache: after each read, ask the kernel to drop the file from its page cache, so that every
            read comes from the disk (benchmarks: the machine's free memory otherwise holds the files).
    """

    def __init__(self, folder: Path | None, device: torch.device, *, reader: str = "read", prefetch: bool = True,
                 drop_page_cache: bool = False) -> None:
        if reader not in READERS:
            raise ValueError(f"unknown offload reader {reader!r}; choose one of {', '.join(READERS)}")
        self.folder = folder
        self.device = torch.device(device)
        self.reader = reader
        self.prefetch = prefetch
        self.drop_page_cache = drop_page_cache
        self.layers: dict[int, _Layer] = {}
        self.order: list[int] = []  # offloaded layer indices in running order
        self.fetches = 0  # layers brought in so far (statistics)
        self._buffers: list[torch.Tensor] = []
        self._next = 0  # which buffer the next read fills
        self._pending: tuple[int, Future] | None = None
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="offload") if prefetch else None
        self._stream = None
        # The folder and its layer files are this store's own: they go when the store does, or at exit.
        self._remove = weakref.finalize(self, shutil.rmtree, folder, ignore_errors=True) if folder else None

    # --- filling -------------------------------------------------------------------------------------------

    def add(self, index: int, weights: dict[str, torch.Tensor]) -> None:
        """Takes layer `index`'s weights (names relative to the layer) out of memory, onto disk or pinned memory."""
        if self.folder is None:
            pinned = self.device.type == "cuda"
            self.layers[index] = _Layer(None, {n: (t.pin_memory() if pinned else t) for n, t in weights.items()}, 0, 0)
        else:
            path = self.folder / f"layer_{index}.safetensors"
            try:
                save_file({n: t.contiguous() for n, t in weights.items()}, str(path))
                handle = open(path, "rb", buffering=0)  # kept open: the store reads it by descriptor, not by name
                os.fsync(handle.fileno())  # dirty pages would survive the page-cache drop below
                header, start = safetensors_header(path)
            except OSError as error:
                raise self._failed("cannot write the layer files to", error) from None
            size = max(entry["data_offsets"][1] for entry in header.values())
            self.layers[index] = _Layer(path, header, start, size, handle)
        self.order = sorted(self.layers)

    def map_resident(self, weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """`weights` written to one file in the folder and returned as views of its memory map (`map_tensors`)."""
        path = self.folder / "resident.safetensors"
        try:
            save_file({n: t.contiguous() for n, t in weights.items()}, str(path))
            header, start = safetensors_header(path)
            return map_tensors(path, header, start)  # a mapping outlives the file's name
        except (OSError, RuntimeError) as error:  # torch.from_file raises RuntimeError
            raise self._failed("cannot write the resident weights to", error) from None

    def weights_of(self, index: int) -> Mapping[str, torch.Tensor]:
        """Layer `index`'s weights as a mapping that reads each tensor into fresh memory when asked (accelerate's
        hooks for module forwards), from the open file or from memory."""
        layer = self.layers[index]
        return layer.entries if layer.handle is None else _FileWeights(self, layer)

    def _failed(self, what: str, error: BaseException) -> OffloadError:
        reason = getattr(error, "strerror", None) or str(error)
        if getattr(error, "errno", None) == errno.ENOSPC:
            reason = "no space left on the device; free some or give --offload-folder on a larger disk"
        return OffloadError(f"{what} offload folder {self.folder}: {reason}")

    @property
    def nbytes(self) -> int:
        """Bytes of all offloaded weights."""
        return sum(layer.nbytes for layer in self.layers.values())

    # --- fetching ------------------------------------------------------------------------------------------

    def fetch(self, index: int) -> dict[str, torch.Tensor]:
        """Layer `index`'s weights on the execution device, valid until the layer after next is fetched."""
        self.fetches += 1
        if self._pending is not None and self._pending[0] == index:
            weights = self._pending[1].result()
        else:
            if self._pending is not None:
                self._pending[1].result()  # never two reads into the buffers at once
            weights = self._load(index)
        self._pending = None
        if self._pool is not None and len(self.order) > 1:
            following = self.order[(self.order.index(index) + 1) % len(self.order)]
            self._pending = (following, self._pool.submit(self._load, following))
        return weights

    def _load(self, index: int) -> dict[str, torch.Tensor]:
        layer = self.layers[index]
        if layer.handle is None:
            return self._to_device(layer.entries)
        try:
            weights = self._read(layer)
            if self.drop_page_cache:
                os.posix_fadvise(layer.handle.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        except (OSError, ValueError, SafetensorError) as error:  # mmap raises ValueError
            raise self._failed(f"cannot read {layer.path.name} from", error) from None
        return self._to_device(weights)

    def _read(self, layer: "_Layer") -> dict[str, torch.Tensor]:
        if self.reader == "accelerate":
            return self._accelerate(layer)
        if self.reader == "mmap":
            # MAP_PRIVATE over the file: pages fault in from the page cache as the kernels touch them, and
            # leave this process's resident set when the last view is dropped.
            size = layer.start + layer.nbytes
            if os.fstat(layer.handle.fileno()).st_size < size:  # a page beyond the end would be SIGBUS, not zeros
                raise OSError(errno.EIO, "file cut short")
            data = mmap.mmap(layer.handle.fileno(), size, flags=mmap.MAP_PRIVATE,
                             prot=mmap.PROT_READ | mmap.PROT_WRITE)
            return _views(torch.frombuffer(data, dtype=torch.uint8)[layer.start:], layer.entries)
        buffer = self._buffer(layer.nbytes)
        _read_exactly(layer.handle.fileno(), buffer[:layer.nbytes], layer.start)
        return _views(buffer, layer.entries)

    def _accelerate(self, layer: "_Layer") -> dict[str, torch.Tensor]:
        from accelerate.utils import OffloadedWeightsLoader

        loader = OffloadedWeightsLoader(index={n: {"safetensors_file": str(layer.path), "weight_name": n}
                                               for n in layer.entries})
        return {name: loader[name] for name in layer.entries}

    def _buffer(self, nbytes: int) -> torch.Tensor:
        """One of two reused read buffers, alternately: the one the layer in use does not read from."""
        if not self._buffers or self._buffers[0].numel() < nbytes:
            largest = max(layer.nbytes for layer in self.layers.values())
            pinned = self.device.type == "cuda"
            self._buffers = [torch.empty(largest, dtype=torch.uint8, pin_memory=pinned) for _ in range(2)]
        buffer = self._buffers[self._next]
        self._next ^= 1
        return buffer

    def _to_device(self, weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        if self.device.type == "cpu":
            return weights
        # A copy stream of its own, so that the prefetched layer's transfer overlaps the current layer's kernels.
        if self._stream is None:
            self._stream = torch.cuda.Stream(self.device)
        consumer = torch.cuda.current_stream(self.device)
        with torch.cuda.stream(self._stream):
            moved = {n: t.to(self.device, non_blocking=True) for n, t in weights.items()}
            event = torch.cuda.Event()
            event.record(self._stream)
        consumer.wait_event(event)
        for tensor in moved.values():
            tensor.record_stream(consumer)  # the allocator must not reuse it before the layer's kernels ran
        if self.folder is not None:
            event.synchronize()  # the pinned read buffer is refilled two layers on: the copy must be done by then
        return moved

    @contextlib.contextmanager
    def discarded_on_error(self) -> Iterator[None]:
        """Closes the store and removes its folder at once if the block fails (filling it, say)."""
        try:
            yield
        except BaseException:
            self.close()
            if self._remove is not None:
                self._remove()
            raise

    def close(self) -> None:
        """Waits for a read in flight, stops the reading thread and closes the layer files."""
        if self._pending is not None:
            self._pending[1].exception()  # a failed read has nobody left to tell
            self._pending = None
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        for layer in self.layers.values():
            if layer.handle is not None:
                layer.handle.close()


class _Layer:
    """Where one offloaded layer lives: a file (open as `handle`) with its header (`entries`), or the tensors."""

    def __init__(self, path: Path | None, entries: dict, start: int, nbytes: int, handle=None) -> None:
        self.path, self.entries, self.start, self.handle = path, entries, start, handle
        self.nbytes = nbytes if path is not None else sum(t.numel() * t.element_size() for t in entries.values())


class _FileWeights(Mapping):
    """One offloaded layer's tensors by name, each read from its open file into fresh memory when asked."""

    def __init__(self, store: LayerStore, layer: _Layer) -> None:
        self.store, self.layer = store, layer

    def __getitem__(self, name: str) -> torch.Tensor:
        entry = self.layer.entries[name]  # KeyError for a name the layer lacks, as a mapping should
        try:
            return read_tensor(self.layer.handle, entry, self.layer.start)
        except OSError as error:
            raise self.store._failed(f"cannot read {self.layer.path.name} from", error) from None

    def __iter__(self):
        return iter(self.layer.entries)

    def __len__(self) -> int:
        return len(self.layer.entries)

    def __deepcopy__(self, memo: dict) -> "_FileWeights":
        return self  # a copied module (a low-precision copy of the decoder) reads the same open files


def _views(data: torch.Tensor, header: dict) -> dict[str, torch.Tensor]:
    """Tensors over the bytes of a safetensors file's data section, without copying."""
    out = {}
    for name, entry in header.items():
        begin, end = entry["data_offsets"]
        raw = data[begin:end]
        if (data.storage_offset() + begin) % _DTYPES[entry["dtype"]].itemsize:
            raw = raw.clone()  # a file laid out without alignment: this one tensor is copied
        out[name] = raw.view(_DTYPES[entry["dtype"]]).view(entry["shape"])
    return out
