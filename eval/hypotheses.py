"""Stored transcripts scored beside decoded configurations (`asr eval --hypotheses FILE[:NAME]`).

Another system's outputs (faster-whisper, whisper.cpp, a cloud API) or an earlier `asr batch` run, read from:
- JSONL: one object per line with an id (`id`, `key`, `utt_id`, `audio` or `file`) and a text (`text`,
  `hypothesis`, `transcript`, `prediction` or `pred_text`); `asr batch` rows are such lines, and a row with an
  `error` counts as that item failed;
- CSV or TSV with a header naming those columns;
- a folder of `.txt` files, one per item, named by the item's id (its path inside the source, without the
  audio's extension).

Items are matched by id: exactly, else by the id without its audio extension, else by its file name's stem.
Every row that cannot be used is counted and reported with one line: a row without an id or a text, an id seen
before (the first is scored), an empty text (scored: every reference word deleted), an id that matches no item;
items without a hypothesis count as failed for that configuration.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from eval.configs import EvalConfig
from eval.backends.decoded import Decoded

ID_KEYS = ("id", "key", "utt_id", "audio", "file")
TEXT_KEYS = ("text", "hypothesis", "transcript", "prediction", "pred_text")


@dataclass
class StoredHypotheses:
    """One `--hypotheses` source: the texts by id, the failed items, and what could not be used."""

    name: str
    path: str
    texts: dict[str, str] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)  # id -> why that item has no text (asr batch rows)
    rows: int = 0
    duplicates: list[str] = field(default_factory=list)
    empty: list[str] = field(default_factory=list)
    unreadable: list[str] = field(default_factory=list)  # "line 7: no id"
    matched: set[str] = field(default_factory=set)
    _by_key: dict[str, str] = field(default_factory=dict)

    def find(self, item_id: str) -> str | None:
        """The stored id for an item id, or None."""
        for key in _keys(item_id):
            if key in self._by_key:
                return self._by_key[key]
        return None

    def unmatched(self) -> list[str]:
        return [i for i in [*self.texts, *self.errors] if i not in self.matched]

    def summary(self, items_missing: list[str]) -> dict[str, Any]:
        """What the report records of this source."""
        return {"name": self.name, "path": self.path, "rows": self.rows,
                "matched": len(self.matched), "missing_items": items_missing, "unmatched_ids": self.unmatched(),
                "duplicate_ids": self.duplicates, "empty_texts": self.empty, "unreadable_rows": self.unreadable}

    def problems(self, items_missing: list[str]) -> list[str]:
        """One line for each kind of row or item that was not scored as given."""
        lines = []
        for count, what, ids in ((len(self.unreadable), "row(s) without an id or a text", self.unreadable),
                                 (len(self.duplicates), "repeated id(s), the first scored", self.duplicates),
                                 (len(self.empty), "empty text(s), scored as deleting every reference word",
                                  self.empty),
                                 (len(self.unmatched()), "id(s) that match no item", self.unmatched()),
                                 (len(items_missing), "item(s) without a hypothesis, counted as failed",
                                  items_missing)):
            if count:
                shown = ", ".join(ids[:5]) + (f" and {count - 5} more" if count > 5 else "")
                lines.append(f"{self.path}: {count} {what}: {shown}")
        return lines

    def _add(self, row_id: str, text: str | None, error: str | None, where: str) -> None:
        self.rows += 1
        if not row_id:
            self.unreadable.append(f"{where}: no id")
            return
        if row_id in self.texts or row_id in self.errors:
            self.duplicates.append(row_id)
            return
        if error:
            self.errors[row_id] = error
        elif text is None:
            self.unreadable.append(f"{where}: no text")
            return
        else:
            self.texts[row_id] = text
            if not text.strip():
                self.empty.append(row_id)
        for key in _keys(row_id):
            self._by_key.setdefault(key, row_id)


class StoredBackend:
    """A configuration that "decodes" an item by looking up its stored text (no timing: it ran elsewhere)."""

    def __init__(self, stored: StoredHypotheses) -> None:
        self.stored = stored
        self.config = EvalConfig(name=stored.name, kind="hypotheses")

    def decode_item(self, item_id: str, language: str | None) -> Decoded:
        stored_id = self.stored.find(item_id)
        if stored_id is None:
            raise LookupError(f"no hypothesis in {self.stored.path}")
        self.stored.matched.add(stored_id)
        if stored_id in self.stored.errors:
            raise RuntimeError(f"the stored run failed on it: {self.stored.errors[stored_id]}")
        return Decoded(text=self.stored.texts[stored_id], language=language)


def parse_spec(spec: str) -> tuple[Path, str]:
    """`FILE[:NAME]` -> (path, name); the name defaults to the file's stem."""
    path, name = spec, None
    if ":" in spec and not Path(spec).exists():
        path, _, name = spec.rpartition(":")
    file = Path(path).expanduser()
    return file, (name or file.stem or str(file)).strip()


def read_hypotheses(spec: str) -> StoredHypotheses:
    """Reads one `--hypotheses FILE[:NAME]`.

    Raises:
        ValueError: no such file, a format that is none of the above, or no usable row at all.
    """
    path, name = parse_spec(spec)
    stored = StoredHypotheses(name=name, path=str(path))
    if not path.exists():
        raise ValueError(f"{path}: no such file or folder (--hypotheses)")
    if path.is_dir():
        for file in sorted(path.rglob("*.txt")):
            stored._add(str(PurePosixPath(file.relative_to(path).with_suffix("").as_posix())),
                        file.read_text(encoding="utf-8", errors="replace").strip(), None, file.name)
    elif path.suffix.lower() in (".csv", ".tsv"):
        _read_table(path, stored, "\t" if path.suffix.lower() == ".tsv" else ",")
    elif path.suffix.lower() in (".jsonl", ".json", ".ndjson"):
        _read_jsonl(path, stored)
    else:
        raise ValueError(f"{path}: not a JSONL, CSV or TSV file or a folder of .txt files (--hypotheses)")
    if not stored.texts and not stored.errors:
        raise ValueError(f"{path}: no hypothesis with an id and a text in it ({stored.rows} row(s); an id column "
                         f"is one of {', '.join(ID_KEYS)}, a text column one of {', '.join(TEXT_KEYS)})")
    return stored


def _read_jsonl(path: Path, stored: StoredHypotheses) -> None:
    with path.open(encoding="utf-8", errors="replace") as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError:
                if number == 1:
                    raise ValueError(f"{path}: line 1 is not JSON; --hypotheses reads JSONL, CSV, TSV or a folder "
                                     "of .txt files") from None
                stored.rows += 1
                stored.unreadable.append(f"line {number}: not JSON")
                continue
            if not isinstance(row, dict):
                stored.rows += 1
                stored.unreadable.append(f"line {number}: not an object")
                continue
            _add_row(stored, row, f"line {number}")


def _read_table(path: Path, stored: StoredHypotheses, delimiter: str) -> None:
    with path.open(encoding="utf-8", errors="replace", newline="") as file:
        reader = csv.DictReader(file, delimiter=delimiter)
        fields = {f.strip().lower() for f in reader.fieldnames or []}
        if not fields & set(ID_KEYS) or not fields & set(TEXT_KEYS):
            raise ValueError(f"{path}: its header ({', '.join(sorted(fields)) or 'none'}) names no id column "
                             f"({', '.join(ID_KEYS)}) or no text column ({', '.join(TEXT_KEYS)})")
        for number, row in enumerate(reader, 2):
            _add_row(stored, {k.strip().lower(): v for k, v in row.items() if k is not None}, f"line {number}")


def _add_row(stored: StoredHypotheses, row: dict[str, Any], where: str) -> None:
    row_id = next((str(row[k]) for k in ID_KEYS if row.get(k) not in (None, "")), "")
    text = next((row[k] for k in TEXT_KEYS if k in row and row[k] is not None), None)
    error = row.get("error") or None
    stored._add(row_id, None if text is None else str(text), None if error is None else str(error), where)


def _keys(item_id: str) -> list[str]:
    """An id, then without its audio extension, then its file name's stem: the ways a system names an item."""
    path = PurePosixPath(item_id.replace("\\", "/"))
    return list(dict.fromkeys([item_id, str(path.with_suffix("")) if path.suffix else item_id, path.stem]))
