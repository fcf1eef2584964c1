"""items.jsonl as the run goes, so that a stopped run continues (`asr eval --resume`).

After each item, its rows (one per configuration, as the finished report's items.jsonl has them) are appended
and flushed to disk: a run killed at any moment (kill -9 included) leaves every finished item whole and at most
one cut line, which `--resume` drops. `--resume` reads the rows back into results, skips those items (no audio
read, nothing decoded twice) and goes on; the report is then computed over all items as one run's.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from eval.backends.decoded import Decoded
from eval.metrics import item_row
from eval.runner import EvalItem, Failure

logger = logging.getLogger(__name__)

# The Decoded fields an items.jsonl row holds (under the same names, but `text`, which is `hypothesis`).
_COUNTS = ("encode_seconds", "decode_seconds", "generated_tokens", "model_forward_passes",
           "assistant_forward_passes", "drafted_tokens", "accepted_tokens", "rounds", "assistant")


class ItemLog:
    """Appends each finished item's rows to `path` (a report's items.jsonl, or a process's part of it); with
    `resume`, first reads what is there (`done`).

    Raises:
        ValueError: (resume) the earlier run compared other configurations, or its file cannot be read.
    """

    def __init__(self, path: str | Path, names: list[str], resume: bool) -> None:
        self.path = Path(path)
        self.names = names
        self.done: dict[str, tuple[float, str | None, dict[str, Decoded | Failure | None]]] = {}
        if resume and self.path.exists():
            self._read()
        elif resume:
            logger.warning("%s: nothing to resume; starting the run", self.path)
        self._handle = self.path.open("a" if resume else "w", encoding="utf-8")
        if resume and self.path.stat().st_size and not self._ends_with_newline():
            self._handle.write("\n")  # the cut line of a killed run stays cut; the next row starts afresh

    def write(self, item: EvalItem, outcomes: dict[str, Decoded | Failure | None]) -> None:
        first = outcomes[self.names[0]]
        for name in self.names:
            row = {"configuration": name, **item_row(item, outcomes[name], first)}
            self._handle.write(json.dumps(row, ensure_ascii=False) + "\n")
        self._handle.flush()
        os.fsync(self._handle.fileno())

    def close(self) -> None:
        self._handle.close()

    def _ends_with_newline(self) -> bool:
        with self.path.open("rb") as file:
            file.seek(-1, os.SEEK_END)
            return file.read(1) == b"\n"

    def _read(self) -> None:
        self.done.update(read_done(self.path, self.names))


def read_done(path: Path, names: list[str]) -> dict[str, tuple[float, str | None, dict[str, Any]]]:
    """The items of an items.jsonl (or a part) that every configuration finished: audio seconds, item error and
    results by configuration (`eval.runner.run_interleaved`'s `done`)."""
    done: dict[str, tuple[float, str | None, dict[str, Any]]] = {}
    rows: dict[str, dict[str, dict[str, Any]]] = {}
    with path.open(encoding="utf-8", errors="replace") as lines:
        for number, line in enumerate(lines, 1):
            try:
                row = json.loads(line)
            except ValueError:
                logger.warning("%s: line %d is cut (the run stopped there); its item is decoded again",
                               path, number)
                continue
            name = row.get("configuration")
            if name not in names:
                raise ValueError(f"{path}: the run there compared {name!r}, not among this run's "
                                 f"configurations ({', '.join(names)}); resume it with the same "
                                 "--compare and --hypotheses, or choose another --report folder")
            rows.setdefault(row["id"], {})[name] = row
    for item_id, by_name in rows.items():
        if set(by_name) == set(names):  # an item is done when every configuration's row is there
            some = next(iter(by_name.values()))
            done[item_id] = (some["audio_seconds"], some.get("item_error"),
                             {name: _outcome(row) for name, row in by_name.items()})
    return done


def _outcome(row: dict[str, Any]) -> Decoded | Failure | None:
    """A row back into what the configuration made of the item."""
    if row.get("item_error"):
        return None
    if row.get("hypothesis") is None:
        return Failure(row.get("error") or "failed")
    histogram = row.get("accepted_length_histogram")
    return Decoded(text=row["hypothesis"], language=row.get("language"), seconds=row.get("seconds") or 0.0,
                   accepted_length_histogram=None if histogram is None else {int(k): v for k, v in histogram.items()},
                   **{key: row.get(key) for key in _COUNTS})
