"""Models larger than memory: decoder layers offloaded to disk (or to CPU memory for a GPU), the rest resident.

accelerate's `device_map="auto"` semantics, made for Whisper and this project's direct decoder pass: the
encoder, the decoder's embeddings and tied output head and its final norm stay on the execution device (they
run once per window, or for every token); decoder layers that do not fit under `max_memory` (all of them when
no limit is given) are offloaded and brought in per layer per pass (`asr.models.layer_store`). Loading reads the
checkpoint tensor by tensor, so the offloaded layers never sit in memory whole.

A pass of an offloaded model costs about the same for one token as for ten, so `--assistant auto` drafts
many tokens per pass with a resident assistant (`asr.assist.choose.offload_assistant`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Iterator

import torch

from asr.models.ct2 import WEIGHTS_UNLIKE_CONFIG, ModelFileError
from asr.models.layer_store import READERS, LayerStore, OffloadError, map_tensors, read_tensor, safetensors_header

logger = logging.getLogger(__name__)

#: Where `--offload` may put the layers that are not resident.
OFFLOAD_DEVICES = ("cpu", "disk")
_LAYERS = "model.decoder.layers."


@dataclass(frozen=True)
class OffloadOptions:
    """Where a model's decoder layers live when they do not stay on the execution device."""

    # "disk": layer files in `folder`, read per pass; "cpu": CPU memory, copied to the GPU per pass;
    # None with max_memory None: nothing offloaded.
    device: str | None = None
    # Folder for the layer files of disk offload (None: a temporary folder, removed at exit).
    folder: str | None = None
    # Bytes of model weights allowed on the execution device; None: every decoder layer is offloaded.
    max_memory: int | None = None
    # How a layer file is read back (asr.models.layer_store.READERS), and whether the next layer is read meanwhile.
    reader: str = "read"
    prefetch: bool = True
    # Drop each layer file from the page cache after reading it, so reads come from the disk (benchmarks; always
    # under a cgroup memory limit).
    drop_page_cache: bool = False

    def __post_init__(self) -> None:
        if self.device is not None and self.device not in OFFLOAD_DEVICES:
            raise ValueError(f"unknown offload device {self.device!r}; choose one of {', '.join(OFFLOAD_DEVICES)}")
        if self.reader not in READERS:
            raise ValueError(f"unknown offload reader {self.reader!r}; choose one of {', '.join(READERS)}")
        if self.max_memory is not None and self.max_memory <= 0:
            raise ValueError(f"--max-memory must be positive, got {self.max_memory}")

    @property
    def enabled(self) -> bool:
        return self.device is not None or self.max_memory is not None


def parse_size(text: str, option: str = "--max-memory") -> int:
    """`300MB`, `1.5GiB`, `2GB` or a plain number of bytes -> bytes (accelerate's units: GB = 10^9, GiB = 2^30);
    `option` names the flag in the error.

    Raises:
        ValueError: not a size.
    """
    from accelerate.utils import convert_file_size_to_int

    text = text.strip()
    try:
        size = int(text) if text.isdigit() else convert_file_size_to_int(text)
    except (ValueError, OverflowError):  # not a number; or infinite ("infGB", "1e400GB")
        size = -1
    if size <= 0:
        raise ValueError(f"{option}: expected a size such as 300MB or 2GiB, got {text!r}")
    return size


def resolve_offload(options: OffloadOptions | None, device: str) -> OffloadOptions | None:
    """Checks offload options against the execution device and fills in what accelerate would.

    `--max-memory` alone offloads what does not fit to the next tier: CPU memory from a GPU, disk from a CPU.

    Raises:
        ValueError: an offload tier the device cannot use, a folder for CPU offload, or an unwritable folder.
    """
    if options is None or not options.enabled:
        if options is not None and options.folder is not None:
            raise ValueError("--offload-folder needs --offload disk (or --max-memory)")
        return None
    kind = torch.device(device).type
    if kind not in ("cpu", "cuda"):
        raise ValueError(f"--offload is not supported with --device {device}; use --device cpu or cuda")
    target = options.device or ("cpu" if kind == "cuda" else "disk")
    if target == "cpu" and kind == "cpu":
        raise ValueError("--offload cpu keeps layers in CPU memory for a model on a GPU, and this model runs on the "
                         "CPU already; use --offload disk")
    if target == "cpu" and options.folder is not None:
        raise ValueError("--offload-folder is for --offload disk; --offload cpu keeps the layers in memory")
    if target == "disk" and options.folder is not None:
        folder = Path(options.folder).expanduser()
        try:
            folder.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryFile(dir=folder):
                pass
        except OSError as error:
            raise ValueError(f"cannot write to offload folder {folder}: {error.strerror or error}") from None
    return replace(options, device=target)


@dataclass(frozen=True)
class Placement:
    """Which decoder layers are offloaded, and the bytes on each side."""

    offloaded: tuple[int, ...]
    resident_bytes: int
    offloaded_bytes: int


def plan_placement(model: torch.nn.Module, options: OffloadOptions, dtype: torch.dtype) -> Placement:
    """Keeps the encoder, embeddings, head and final norm resident, then decoder layers in order while they fit.

    With a limit, two layers' worth of read buffers are set aside as soon as one layer is offloaded (accelerate
    sets aside the largest layer).

    Raises:
        OffloadError: `max_memory` cannot hold even the parts that must stay resident.
    """
    size = torch.tensor([], dtype=dtype).element_size()
    layers = model.get_decoder().layers
    layer_bytes = [sum(p.numel() for p in layer.parameters()) * size for layer in layers]
    total = sum(p.numel() for p in model.parameters()) * size  # a tied parameter is listed once
    resident = total - sum(layer_bytes)
    offloaded = list(range(len(layers)))
    if options.max_memory is not None:
        needed = resident + 2 * max(layer_bytes)
        if needed > options.max_memory:
            raise OffloadError(f"--max-memory {_mb(options.max_memory)} cannot hold the model's resident parts "
                             f"(encoder, embeddings and output head, two layer buffers: {_mb(needed)}); "
                             f"give at least {_mb(needed)}")
        budget, kept = options.max_memory - resident, 0
        if sum(layer_bytes) <= budget:
            kept = len(layers)
        else:
            budget -= 2 * max(layer_bytes)
            while kept < len(layers) and layer_bytes[kept] <= budget:
                budget -= layer_bytes[kept]
                kept += 1
        offloaded = offloaded[kept:]
    moved = sum(layer_bytes[i] for i in offloaded)
    return Placement(tuple(offloaded), total - moved, moved)


def _mb(size: int) -> str:
    return f"{size / 1e6:.0f}MB"


def load_offloaded(folder: Path, config, options: OffloadOptions, device: str,
                   dtype: torch.dtype) -> torch.nn.Module:
    """A `WhisperForConditionalGeneration` from a folder of safetensors files, with decoder layers offloaded.

    Resident tensors are read one at a time into their own memory (on a CPU, mapped from the file instead);
    offloaded layers go straight to their store, so loading never holds the whole model. Module forwards (word
    alignment, transformers' generate) still work: each offloaded layer carries accelerate's `AlignDevicesHook`
    over the same weights.

    Raises:
        OffloadError: see `plan_placement`; or the offload folder has no room for the layer files.
        OSError: the checkpoint cannot be read.
    """
    from accelerate.utils import set_module_tensor_to_device
    from transformers import GenerationConfig, WhisperForConditionalGeneration

    with torch.device("meta"):
        model = WhisperForConditionalGeneration(config)
    placement = plan_placement(model, options, dtype)
    # Under a cgroup memory limit (read once here) every megabyte left to the page cache counts.
    limited = torch.device(device).type == "cpu" and memory_limit() is not None
    store = _new_store(options, device, limited, placement.offloaded_bytes)
    shapes = {name: tensor.shape for name, tensor in model.state_dict().items()}
    with store.discarded_on_error():  # a failed load leaves no layer files behind
        wanted = {i: {n for n, _ in model.get_decoder().layers[i].named_parameters()} for i in placement.offloaded}
        pending: dict[int, dict[str, torch.Tensor]] = {i: {} for i in placement.offloaded}
        # On a CPU the resident weights stay file-backed: views of the checkpoint's memory map, or of a converted
        # copy in the offload folder. Under a memory limit the kernel can then drop and re-read their pages, as it
        # does for a model transformers loads whole; read into this process's own memory they could not leave it.
        mapped = store.folder is not None and torch.device(device).type == "cpu"
        converted: dict[str, torch.Tensor] = {}
        # (Offloaded layers are read, not mapped: only their files in the offload folder are touched afterwards.)
        resident = (lambda name: _layer_of(name)[0] not in pending) if mapped else None
        for name, tensor in _checkpoint_tensors(folder, resident):
            if shapes.get(name) != tensor.shape:  # transformers refuses it too (asr.models.registry)
                raise ModelFileError(f"{folder}: {WEIGHTS_UNLIKE_CONFIG} ({name[:80]!r})")
            index, rest = _layer_of(name)
            if tensor.is_floating_point() and tensor.dtype != dtype:
                tensor = tensor.to(dtype)
                if mapped and index not in pending:
                    converted[name] = tensor
                    continue
            if index in pending:
                pending[index][rest] = tensor
                if pending[index].keys() == wanted[index]:
                    store.add(index, pending.pop(index))
            else:
                set_module_tensor_to_device(model, name, device, value=tensor, dtype=tensor.dtype)
        if converted:
            for name, tensor in store.map_resident(converted).items():
                set_module_tensor_to_device(model, name, device, value=tensor, dtype=tensor.dtype)
        model.tie_weights()
        missing = [n for n, p in model.named_parameters() if p.is_meta and _layer_of(n)[0] not in store.layers]
        if missing or pending:
            raise ModelFileError(f"{folder}: {WEIGHTS_UNLIKE_CONFIG} (no {', '.join(missing[:3]) or 'layer weights'})")
    generation = folder / "generation_config.json"
    if generation.is_file():
        model.generation_config = GenerationConfig.from_pretrained(folder)
    _attach_hooks(model, store, device)
    model._offload_store = store
    if mapped and limited:
        # Without a limit the allocator's reuse is faster (the encoder took ~25 % longer with this setting).
        return_freed_memory()
    model.eval()
    logger.info("offloaded %d of %d decoder layers to %s (%s; %s resident)", len(placement.offloaded),
                len(model.get_decoder().layers), options.device, _mb(placement.offloaded_bytes),
                _mb(placement.resident_bytes))
    return model


# Allocations from this size on get pages of their own, given back to the system when freed.
_OWN_PAGES_FROM = 1 << 20


def memory_limit(groups_file: Path = Path("/proc/self/cgroup"), root: Path = Path("/sys/fs/cgroup")) -> int | None:
    """The memory limit of this process's cgroup (v1 or v2) in bytes, where it is below the machine's memory;
    None without one or where it cannot be read."""
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    try:
        groups = groups_file.read_text().splitlines()
    except OSError:
        return None
    for line in groups:
        fields = line.split(":", 2)
        if len(fields) != 3:
            continue
        _, controllers, path = fields
        if controllers == "":
            file = root / path.lstrip("/") / "memory.max"
        elif "memory" in controllers.split(","):
            file = root / "memory" / path.lstrip("/") / "memory.limit_in_bytes"
        else:
            continue
        try:
            text = file.read_text().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < physical:
            return int(text)
    return None


def return_freed_memory() -> bool:
    """Makes glibc's allocator give freed memory back to the system instead of keeping it for reuse; returns
    whether it could (glibc only).

    By default a freed block of up to 32 MB stays in the process's heap (glibc raises its mmap threshold after
    each large free), so an encoder window's activations and a window's caches leave ~100-150 MB of anonymous
    memory behind, which the kernel cannot reclaim without swap. For an offloaded model under a memory limit,
    that decided an offloaded run's speed (docs/offload.md). Used only under a memory limit (`memory_limit`).
    """
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3  # <malloc.h>
    return bool(mallopt(m_mmap_threshold, _OWN_PAGES_FROM)) and bool(mallopt(m_trim_threshold, _OWN_PAGES_FROM))


def offload_store(model: torch.nn.Module) -> LayerStore | None:
    """The store of `model`'s offloaded decoder layers, or None when every layer is resident."""
    store = getattr(model, "_offload_store", None)
    return store if store is not None and store.layers else None


@contextlib.contextmanager
def materialized(layer: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """`layer` with its weights present, for code that reads a layer's parameters (a copy of the decoder):
    an offloaded layer is brought in through its accelerate hook for the duration and sent back after."""
    hook = getattr(layer, "_hf_hook", None)
    if hook is None or not getattr(hook, "offload", False):
        yield layer
        return
    hook.pre_forward(layer)
    try:
        yield layer
    finally:
        hook.post_forward(layer, None)


def _new_store(options: OffloadOptions, device: str, limited: bool, needed: int) -> LayerStore:
    if options.device == "cpu":
        return LayerStore(None, torch.device(device), prefetch=options.prefetch)
    parent = Path(options.folder).expanduser() if options.folder else None
    _check_room(parent or Path(tempfile.gettempdir()), needed)
    try:
        folder = Path(tempfile.mkdtemp(prefix="asr-offload-", dir=parent))
    except OSError as error:  # the folder went between the option check and the load
        raise OffloadError(f"cannot write to offload folder {parent or tempfile.gettempdir()}: "
                           f"{error.strerror or error}") from None
    # Under a memory limit (`limited`) the layer files, read once a pass, would push the resident weights' pages
    # out of the page cache the limit leaves: they are dropped after each read (docs/offload.md: 20.6 s against
    # 26.2 s at a 700 MB limit).
    return LayerStore(folder, torch.device(device), reader=options.reader, prefetch=options.prefetch,
                      drop_page_cache=options.drop_page_cache or limited)


def _check_room(folder: Path, needed: int) -> None:
    """Refuses a folder without room for the layer files before any is written (a folder that fills up anyway,
    beside another writer, is the store's one-line error)."""
    free = shutil.disk_usage(folder).free
    if free < needed:
        raise OffloadError(f"offload folder {folder} has {_mb(free)} free and the offloaded layers need "
                           f"{_mb(needed)}; free some space or give --offload-folder on a larger disk")


def _attach_hooks(model: torch.nn.Module, store: LayerStore, device: str) -> None:
    from accelerate.hooks import AlignDevicesHook, add_hook_to_module

    layers = model.get_decoder().layers
    for index in store.layers:
        add_hook_to_module(layers[index], AlignDevicesHook(execution_device=device, offload=True,
                                                           weights_map=store.weights_of(index),
                                                           place_submodules=True))


def _layer_of(name: str) -> tuple[int | None, str]:
    """`model.decoder.layers.3.fc1.weight` -> (3, `fc1.weight`); (None, name) outside the decoder layers."""
    if not name.startswith(_LAYERS):
        return None, name
    index, _, rest = name[len(_LAYERS):].partition(".")
    return int(index), rest


def _checkpoint_tensors(folder: Path, mapped: Callable[[str], bool] | None = None
                        ) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor of a folder's safetensors checkpoint (one file or shards with an index), one at a time: read
    into fresh memory, or, where `mapped(name)` holds, a view of a private memory map of the file."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
            raise ModelFileError(f"{index}: not a safetensors index (a weight_map of file names)") from None
        if not all(isinstance(f, str) and f and Path(f).name == f for f in files):
            raise ModelFileError(f"{index}: names files outside its folder")
    elif (folder / "model.safetensors").is_file():
        files = ["model.safetensors"]
    else:
        raise OSError(f"{folder}: no model.safetensors (offloading reads safetensors checkpoints)")
    for file in files:
        header, start = safetensors_header(folder / file)
        views = map_tensors(folder / file, header, start) if mapped is not None else {}
        with open(folder / file, "rb") as handle:
            for name, entry in sorted(header.items(), key=lambda item: item[1]["data_offsets"][0]):
                yield name, views[name] if mapped is not None and mapped(name) else read_tensor(handle, entry, start)
