"""Several processes on one output (`accelerate launch --num_processes N -m asr batch ...`).

Item i goes to process i % N. Process k writes `OUTPUT.part-0000k-of-0000N`, and when its share is done a
marker `OUTPUT.part-0000k-of-0000N.done` holding its figures. Process 0 waits for all N markers, merges the
parts (and rows of earlier runs) into OUTPUT in input order, and removes them. Markers and polling rather
than a collective barrier at the end: shares can differ by hours, longer than a process group's timeout.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from collections.abc import Iterable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from asr.batch.output import is_error_row, iter_rows

logger = logging.getLogger(__name__)

_PART = re.compile(r"\.part-(\d{5})-of-(\d{5})$")


@dataclass(frozen=True)
class Processes:
    """Where this process stands among those launched together."""

    # This process's rank, how many there are in all, and how many on this machine.
    index: int = 0
    count: int = 1
    local_index: int = 0
    local_count: int = 1

    @property
    def is_main(self) -> bool:
        return self.index == 0

    def owns(self, position: int) -> bool:
        """True when the item at `position` in the input is this process's to transcribe (round-robin)."""
        return position % self.count == self.index


def _env_int(names: Iterable[str], default: int) -> int:
    for name in names:
        if os.environ.get(name, "").strip().isdigit():
            return int(os.environ[name])
    return default


def detect_processes() -> Processes:
    """This process's place, from the variables torchrun (`accelerate launch`) or mpirun set; one process without them."""
    count = _env_int(("WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE"), 1)
    index = _env_int(("RANK", "PMI_RANK", "OMPI_COMM_WORLD_RANK", "MV2_COMM_WORLD_RANK"), 0)
    local_index = _env_int(("LOCAL_RANK", "MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK"), index if count > 1 else 0)
    local_count = _env_int(("LOCAL_WORLD_SIZE", "MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE"), count)
    if not 0 <= index < count:
        raise ValueError(f"process rank {index} is outside a world of {count} process(es)")
    return Processes(index, count, local_index, max(1, local_count))


def start_together(processes: Processes, cpu: bool) -> None:
    """Waits until every process has checked the output (`asr.batch.run.prepare_output`), before any writes.

    Args:
        processes: this process's place; one process returns at once.
        cpu: the processes run on CPUs (a gloo group); else accelerate picks the accelerator's backend.
    """
    if processes.count == 1:
        return
    from accelerate import PartialState

    PartialState(cpu=cpu).wait_for_everyone()


def finish(processes: Processes) -> None:
    """Leaves the process group (if `start_together` made one), so that the process exits cleanly."""
    if processes.count == 1:
        return
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def part_path(output: Path, index: int, count: int) -> Path:
    return output.with_name(f"{output.name}.part-{index:05d}-of-{count:05d}")


def marker_path(part: Path) -> Path:
    return part.with_name(part.name + ".done")


def merging_path(output: Path) -> Path:
    return output.with_name(output.name + ".merging")


def existing_parts(output: Path) -> list[Path]:
    """Part files of any earlier or current run on `output`, sorted by name."""
    if not output.parent.is_dir():
        return []
    prefix = output.name + ".part-"
    return sorted(p for p in output.parent.iterdir() if p.name.startswith(prefix) and _PART.search(p.name))


def leftovers(output: Path) -> list[Path]:
    """Everything runs on `output` leave beside it: parts, their markers, half-written merges and rewrites."""
    if not output.parent.is_dir():
        return []
    prefix = output.name + ".part-"
    found = sorted(p for p in output.parent.iterdir() if p.name.startswith(prefix))
    return found + [p for p in (merging_path(output), output.with_name(output.name + ".tmp")) if p.exists()]


def mark_done(part: Path, figures: dict[str, Any]) -> None:
    """Says that `part` holds every row of its share; `figures` go to the summary of process 0."""
    marker = marker_path(part)
    temporary = marker.with_name(marker.name + ".tmp")
    temporary.write_text(json.dumps(figures), encoding="utf-8")
    os.replace(temporary, marker)


def wait_for_parts(output: Path, count: int, poll_seconds: float = 0.5) -> list[dict[str, Any]]:
    """Waits until all `count` parts of this run are marked done; returns their figures, by process.

    A process that dies takes the launcher, and this one with it (torchrun stops every worker when one fails).
    """
    markers = [marker_path(part_path(output, k, count)) for k in range(count)]
    waiting_since = time.monotonic()
    while not all(m.exists() for m in markers):
        if time.monotonic() - waiting_since > 60:
            logger.info("waiting for %d other process(es) to finish", sum(not m.exists() for m in markers))
            waiting_since = time.monotonic()
        time.sleep(poll_seconds)
    return [json.loads(m.read_text(encoding="utf-8")) for m in markers]


def merge_parts(output: Path, order: list[str]) -> int:
    """Merges OUTPUT (rows of earlier runs) and every part file into OUTPUT, in input order; removes the parts.

    Args:
        output: the results file.
        order: the input's ids in input order. Rows whose id is not in it (an input that changed since) go last.

    Returns:
        The number of rows in the merged file.

    Each id is kept once (the first row found, OUTPUT first, unless it is an error row and a later one is not:
    the item was retried): a merge killed after the rename but before the parts were removed is simply done again. The merged file is written beside OUTPUT and renamed over it.
    """
    sources = [output, *existing_parts(output)]
    where: dict[str, tuple[int, int, int]] = {}  # id -> (source, offset, length): the rows stay on disk
    failed: set[str] = set()  # ids whose kept row is an error row
    for number, source in enumerate(sources):
        for row_id, offset, line in iter_rows(source):
            if row_id is None or (row_id in where and row_id not in failed):
                continue
            error = is_error_row(line)
            if row_id not in where or not error:
                where[row_id] = (number, offset, len(line))
                failed.discard(row_id)
                if error:
                    failed.add(row_id)
    count = len(where)
    temporary = merging_path(output)
    with ExitStack() as stack:
        handles = [stack.enter_context(open(source, "rb")) if source.is_file() else None for source in sources]
        merged = stack.enter_context(open(temporary, "wb"))
        for row_id in order:
            if row_id in where:
                _copy_row(handles, where.pop(row_id), merged)
        for place in sorted(where.values()):
            _copy_row(handles, place, merged)
        merged.flush()
        os.fsync(merged.fileno())
    os.replace(temporary, output)
    for path in leftovers(output):
        path.unlink(missing_ok=True)
    return count


def _copy_row(handles: list[BinaryIO | None], place: tuple[int, int, int], merged: BinaryIO) -> None:
    number, offset, length = place
    handle = handles[number]
    handle.seek(offset)
    merged.write(handle.read(length))
