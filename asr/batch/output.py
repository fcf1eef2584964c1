"""The rows of `asr batch`: one JSON line per item, appended so that a killed run never leaves a broken file.

A row is written with one `write()` of a complete line (the newline last) and flushed, so after `kill -9`
the file holds whole rows plus at most one partial line at the end. `read_done_ids(path, repair=True)` cuts
that partial line off before a resumed run appends to the file: every item ends up exactly once.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

try:
    import fcntl
except ImportError:  # Windows: no advisory locks; one run per output is then up to the user
    fcntl = None

from asr.batch.sources import Item
from asr.errors import first_line
from asr.results import Transcript

logger = logging.getLogger(__name__)


def make_row(item: Item, transcript: Transcript | None, error: str | None, with_segments: bool) -> dict[str, Any]:
    """The output row of one item: its transcript, or `error` (one line) when it has none.

    Every row has the same keys (`text`, `language`, `stats` are None in an error row), so that tables built
    from the file have the same columns whatever failed; `segments` only with `with_segments`, `reference`
    only when the source has a reference text.
    """
    row: dict[str, Any] = {
        "id": item.id,
        "audio": item.display,
        "text": transcript.text if transcript is not None else None,
        "language": transcript.language if transcript is not None else None,
    }
    if with_segments:
        row["segments"] = [s.to_dict() for s in transcript.segments] if transcript is not None else None
    if item.text is not None:
        row["reference"] = item.text
    row["stats"] = transcript.stats.to_dict() if transcript is not None else None
    row["error"] = None if transcript is not None else first_line(error or "failed") or "failed"
    return row


class OutputLock:
    """An exclusive lock on `OUTPUT.lock`, held for a whole run: from the check of what exists (and the
    deletions of `--overwrite`) through the last row and the merge. A second run on the same output, plain,
    resuming or overwriting, fails at once instead of writing the same items again or deleting rows under the
    first. The kernel releases it even on `kill -9` (the small `.lock` file then stays; the next run takes it
    over); a run that ends removes it.

    Locks held by this process are counted, so nested holders (the command, then `run_batch`) share one.

    Raises:
        ValueError: another run holds the lock, or the output's folder cannot be made or written.
    """

    _held: dict[Path, list] = {}  # path -> [fd, holders] for this process

    def __init__(self, output: str | os.PathLike) -> None:
        self.path = Path(output).with_name(Path(output).name + ".lock")
        self._acquired = False

    def acquire(self) -> OutputLock:
        key = self.path.resolve()
        held = OutputLock._held.get(key)
        if held is not None:
            held[1] += 1
        else:
            OutputLock._held[key] = [self._lock(), 1]
        self._acquired = True
        return self

    def _lock(self) -> int:
        """Opens and locks the lock file. The file is removed on release, so a lock taken on a file another
        run has just removed would lock nothing: then the path is opened again."""
        output = self.path.with_suffix("")
        while True:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o644)
            except OSError as error:  # a folder that cannot be made or written (/proc, read-only, a file there)
                raise ValueError(f"{output}: cannot write there ({error.strerror or error})") from None
            if fcntl is None:
                return fd
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise ValueError(f"{output}: another run is using this output; wait for it or stop it") from None
            try:
                if os.stat(self.path).st_ino == os.fstat(fd).st_ino:
                    return fd
            except FileNotFoundError:
                pass
            os.close(fd)

    def release(self) -> None:
        if not self._acquired:
            return
        self._acquired = False
        key = self.path.resolve()
        held = OutputLock._held[key]
        held[1] -= 1
        if held[1] == 0:
            del OutputLock._held[key]
            self.path.unlink(missing_ok=True)  # while still locked: see `_lock`
            os.close(held[0])

    def __enter__(self) -> OutputLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


class RowWriter:
    """Appends rows to a JSONL file, each with one `write()` of a whole line.

    The file is locked while open (`flock`, released by the kernel even on `kill -9`): a second run on the
    same output fails at once instead of interleaving its rows with this one's.

    Raises:
        ValueError: another process holds the file.
    """

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = -1
        # A file this writer creates and leaves empty (the run failed before its first row) is removed on close,
        # so that it does not pass for earlier results in the next run.
        self._created = not self.path.exists()
        self._open()

    def _open(self) -> None:
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        if fcntl is not None:
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(self._fd)
                self._fd = -1
                raise ValueError(f"{self.path}: another run is writing to it; wait for it or stop it") from None

    def resume(self, retry_errors: bool = False) -> set[str]:
        """Repairs the file for appending (see `read_done_ids`) and returns the ids it holds; with `retry_errors`
        the error rows are dropped from the file first, so that their items are transcribed again (once)."""
        done = read_done_ids(self.path, repair=True, drop_errors=retry_errors)
        if os.stat(self.path).st_ino != os.fstat(self._fd).st_ino:  # rewritten beside and renamed: reopen
            os.close(self._fd)
            self._open()
        return done

    def write(self, row: dict[str, Any]) -> None:
        data = (json.dumps(row, ensure_ascii=False) + "\n").encode("utf-8")
        view = memoryview(data)
        while view:  # a regular file takes it whole; the loop is for the rare short write
            written = os.write(self._fd, view)
            view = view[written:]

    def sync(self) -> None:
        """Forces the rows written so far to disk (they already survive a killed process; this is for power loss)."""
        os.fsync(self._fd)

    def close(self) -> None:
        if self._fd >= 0:
            os.fsync(self._fd)
            empty = os.fstat(self._fd).st_size == 0
            if self._created and empty:
                self.path.unlink(missing_ok=True)  # still under the lock: nobody else uses the name
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> RowWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def iter_rows(path: str | os.PathLike) -> Iterator[tuple[str | None, int, bytes]]:
    """The complete lines of a results file as (id, offset, line), id None for a line that is not a row.

    A partial last line (no newline: a run killed mid-write) is left out. Read line by line: the file may be large.
    """
    path = Path(path)
    if not path.is_file():
        return
    with open(path, "rb") as handle:
        offset = 0
        for line in handle:
            if not line.endswith(b"\n"):
                return
            yield _row_id(line), offset, line
            offset += len(line)


def read_done_ids(path: str | os.PathLike, repair: bool = False, drop_errors: bool = False) -> set[str]:
    """Ids of the complete rows in a results file (empty when there is no file).

    Args:
        path: a results file.
        repair: make the file fit for appending: cut off a partial last line (a run killed mid-write) and drop
            lines that are not rows. Only the process that appends to the file may repair it.
        drop_errors: error rows do not count as done; with `repair` they are removed from the file.
    """
    path = Path(path)
    done: set[str] = set()
    end = bad = errors = 0
    for row_id, offset, line in iter_rows(path):
        if row_id is None:
            bad += 1
        elif drop_errors and is_error_row(line):
            errors += 1
        else:
            done.add(row_id)
        end = offset + len(line)
    if repair and (bad or errors):
        if bad:
            logger.warning("%s: dropping %d line(s) that are not rows", path, bad)
        if errors:
            logger.warning("%s: retrying the %d item(s) that failed before", path, errors)
        _rewrite_rows(path, drop_errors)
    elif repair and path.is_file() and path.stat().st_size > end:
        logger.warning("%s: cutting off a partial last line (%d bytes) left by an interrupted run",
                       path, path.stat().st_size - end)
        with open(path, "r+b") as handle:
            handle.truncate(end)
            os.fsync(handle.fileno())
    return done


def _row_id(line: bytes) -> str | None:
    try:
        row = json.loads(line)
    except ValueError:
        return None
    return str(row["id"]) if isinstance(row, dict) and "id" in row else None


def is_error_row(line: bytes) -> bool:
    """True for a row whose `error` is set (an item that failed)."""
    try:
        return json.loads(line).get("error") is not None
    except (ValueError, AttributeError):
        return False


def _rewrite_rows(path: Path, drop_errors: bool = False) -> None:
    """Rewrites `path` with its complete rows only (less the error rows with `drop_errors`), atomically: a file
    beside it, fsync, rename."""
    temporary = path.with_name(path.name + ".tmp")
    with open(temporary, "wb") as handle:
        for row_id, _, line in iter_rows(path):
            if row_id is not None and not (drop_errors and is_error_row(line)):
                handle.write(line)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)
