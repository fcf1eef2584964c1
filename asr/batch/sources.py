"""Where batch and evaluation items come from: a folder, a JSONL/CSV manifest, or a `datasets` dataset.

Every source yields `Item`s in a stable order; a row that cannot be used becomes an item with `error` set,
so it is reported in the output instead of stopping the run.
"""

from __future__ import annotations

import csv
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np

from asr.errors import first_line

AUDIO_SUFFIXES = frozenset({".wav", ".flac", ".ogg", ".opus", ".mp3", ".aiff", ".aif", ".m4a", ".mp4", ".webm",
                            ".wma", ".aac", ".oga"})
MANIFEST_SUFFIXES = (".jsonl", ".json", ".csv", ".tsv")
AUDIO_KEYS = ("audio", "audio_filepath", "path", "file", "filename")
TEXT_KEYS = ("text", "reference", "transcript", "sentence")


@dataclass
class Item:
    """One thing to transcribe."""

    id: str
    # A file path, or encoded audio bytes (from a dataset), or None when the row had no usable audio.
    audio: str | bytes | None
    # Reference transcript, when the source has one.
    text: str | None = None
    # Group for per-subset figures (manifest folder or a `subset` field).
    subset: str | None = None
    # Language of the reference, when the source says.
    language: str | None = None
    # Why the row cannot be used (None when it can).
    error: str | None = None
    # File name hint for audio given as bytes (decides the decoder).
    name: str | None = None

    @property
    def display(self) -> str:
        """The audio's path or name, for output rows."""
        return self.audio if isinstance(self.audio, str) else (self.name or self.id)


def load_item_audio(item: Item) -> np.ndarray:
    """Decodes an item's audio to 16 kHz mono float32.

    Raises:
        audio.AudioError: missing, corrupt, empty or undecodable audio.
    """
    from audio import AudioError, load_audio

    if item.error is not None:
        raise AudioError(f"{item.display}: {item.error}")
    if isinstance(item.audio, bytes):
        suffix = Path(item.name or "audio.wav").suffix or ".wav"
        with tempfile.NamedTemporaryFile(suffix=suffix) as handle:
            handle.write(item.audio)
            handle.flush()
            try:
                return load_audio(handle.name)
            except AudioError as error:
                raise AudioError(str(error).replace(handle.name, item.display)) from None
    if item.audio is None:
        raise AudioError(f"{item.id}: no audio in this row")
    return load_audio(item.audio)


def iter_items(source: str, *, audio_column: str = "audio", text_column: str = "text",
               split: str | None = None) -> Iterator[Item]:
    """Yields the items of a folder, a manifest (.jsonl/.json/.csv/.tsv) or a dataset (saved, audiofolder, hub).

    Raises:
        ValueError: the source does not exist or is of no known kind.
    """
    path = Path(source).expanduser()
    if path.is_file():
        suffix = path.suffix.lower()
        if suffix == ".json" and _starts_with(path, b"["):
            yield from _json_array_items(path)
            return
        if suffix in (".jsonl", ".json"):
            yield from _jsonl_items(path)
            return
        if suffix in (".csv", ".tsv"):
            yield from _csv_items(path)
            return
        if suffix in AUDIO_SUFFIXES:
            yield Item(id=str(path), audio=str(path))
            return
        raise ValueError(f"{source}: not a manifest (.jsonl, .csv, .tsv), an audio file or a folder")
    if path.is_dir():
        if (path / "dataset_info.json").is_file() or (path / "dataset_dict.json").is_file() \
                or (path / "state.json").is_file():
            yield from _dataset_items(str(path), audio_column, text_column, split, saved=True)
        else:
            yield from _folder_items(path)
        return
    if _looks_like_hub_id(source):
        yield from _dataset_items(source, audio_column, text_column, split, saved=False)
        return
    raise ValueError(f"{source}: no such file or folder")


def _looks_like_hub_id(source: str) -> bool:
    """`org/name` that is not a local path: one slash, no file suffix, no existing first folder."""
    parts = source.split("/")
    if len(parts) != 2 or not all(parts) or source.startswith(("~", ".")):
        return False
    suffix = Path(source).suffix.lower()
    return suffix not in (*MANIFEST_SUFFIXES, *AUDIO_SUFFIXES) and not Path(parts[0]).exists()


def _folder_items(folder: Path) -> Iterator[Item]:
    """Audio files below `folder`, recursively and sorted; `x.txt` beside `x.wav` is its reference."""
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix.lower() in AUDIO_SUFFIXES)
    for file in files:
        sidecar = file.with_suffix(".txt")
        text = sidecar.read_text(encoding="utf-8").strip() if sidecar.is_file() else None
        subset = str(file.parent.relative_to(folder)) if file.parent != folder else None
        yield Item(id=str(file.relative_to(folder)), audio=str(file), text=text, subset=subset)


def _row_item(row: dict, folder: Path, line: int, manifest: Path) -> Item:
    audio = next((row[k] for k in AUDIO_KEYS if isinstance(row.get(k), str) and row[k]), None)
    item_id = str(row.get("id") or row.get("utt_id") or audio or f"{manifest.name}:{line}")
    if audio is None:
        return Item(id=item_id, audio=None, error=f"{manifest}:{line}: no audio path ({', '.join(AUDIO_KEYS)})")
    audio_path = Path(audio).expanduser()
    if not audio_path.is_absolute():
        audio_path = folder / audio_path
    text = next((row[k] for k in TEXT_KEYS if isinstance(row.get(k), str)), None)
    subset = row.get("subset") or (manifest.parent.name if manifest.parent != Path(".") else None)
    return Item(id=item_id, audio=str(audio_path), text=text, subset=str(subset) if subset else None,
                language=row.get("language"))


def _starts_with(path: Path, prefix: bytes) -> bool:
    """True when the file's first non-blank bytes (after a UTF-8 byte-order mark) are `prefix`."""
    with open(path, "rb") as handle:
        head = handle.read(4096).removeprefix(b"\xef\xbb\xbf").lstrip()
    return head.startswith(prefix)


def _json_array_items(manifest: Path) -> Iterator[Item]:
    """A `.json` manifest holding one array of row objects."""
    try:
        rows = json.loads(manifest.read_text(encoding="utf-8-sig"))
    except (OSError, ValueError) as error:
        raise ValueError(f"{manifest}: not a readable JSON array ({first_line(error)})") from None
    for number, row in enumerate(rows, start=1):
        if not isinstance(row, dict):
            yield Item(id=f"{manifest.name}:{number}", audio=None,
                       error=f"{manifest}: element {number} is not a JSON object")
            continue
        yield _row_item(row, manifest.parent, number, manifest)


def _jsonl_items(manifest: Path) -> Iterator[Item]:
    folder = manifest.parent
    # utf-8-sig: a byte-order mark (as Windows editors write) is not part of the first row.
    with open(manifest, encoding="utf-8-sig") as handle:
        for line_number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                if not isinstance(row, dict):
                    raise ValueError("not a JSON object")
            except ValueError as error:
                yield Item(id=f"{manifest.name}:{line_number}", audio=None,
                           error=f"{manifest}:{line_number}: unreadable manifest line ({error})")
                continue
            yield _row_item(row, folder, line_number, manifest)


def _csv_items(manifest: Path) -> Iterator[Item]:
    delimiter = "\t" if manifest.suffix.lower() == ".tsv" else ","
    # utf-8-sig: Excel's "CSV UTF-8" starts with a byte-order mark, which must not become part of the first
    # column's name. strict: a quote left open would otherwise swallow every row after it without a word.
    with open(manifest, encoding="utf-8-sig", newline="") as handle:
        reader = csv.DictReader(handle, delimiter=delimiter, strict=True)
        try:
            for row in reader:
                yield _row_item({k: v for k, v in row.items() if k is not None}, manifest.parent, reader.line_num,
                                manifest)
        except csv.Error as error:
            raise ValueError(f"{manifest}:{reader.line_num}: malformed CSV ({error}); is a quote left open?") from None


def _dataset_items(name: str, audio_column: str, text_column: str, split: str | None, saved: bool) -> Iterator[Item]:
    """Rows of a `datasets` dataset; audio is read as encoded bytes and decoded by `load_item_audio`."""
    import datasets

    try:
        if saved:
            data = datasets.load_from_disk(name)
        else:
            data = datasets.load_dataset(name, split=split, streaming=True)
    except Exception as error:  # datasets raises many kinds; the user needs one line
        raise ValueError(f"{name}: cannot open dataset ({first_line(error)})") from None
    if isinstance(data, (datasets.DatasetDict, datasets.IterableDatasetDict)):
        chosen = split or ("test" if "test" in data else next(iter(data)))
        if chosen not in data:
            raise ValueError(f"{name}: no split {chosen!r}; splits: {', '.join(data)}")
        data = data[chosen]
    columns = data.column_names or []
    if audio_column not in columns:
        raise ValueError(f"{name}: no audio column {audio_column!r}; columns: {', '.join(columns)}")
    if isinstance(data.features.get(audio_column), datasets.Audio):
        data = data.cast_column(audio_column, datasets.Audio(decode=False))
    for index, row in enumerate(data):
        value = row[audio_column]
        text = row.get(text_column) if text_column in columns else None
        item_id = str(row.get("id", index))
        if isinstance(value, dict):
            audio_bytes, path = value.get("bytes"), value.get("path")
            if audio_bytes:
                yield Item(id=item_id, audio=audio_bytes, text=text, name=os.path.basename(path or f"{item_id}.wav"))
            elif path:
                yield Item(id=item_id, audio=path, text=text)
            else:
                yield Item(id=item_id, audio=None, text=text, error="row has no audio")
        elif isinstance(value, str):
            yield Item(id=item_id, audio=value, text=text)
        else:
            yield Item(id=item_id, audio=None, text=text, error=f"unsupported audio value of type {type(value).__name__}")
