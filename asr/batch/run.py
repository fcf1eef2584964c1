"""`asr batch`: a whole dataset in, one JSON row per item out; resumable, batched, and sharded across processes.

The steps of a run (`run_batch`):
1. take this process's share of the items (round-robin) less those already in the output (`--resume`);
2. decode audio in background threads, a bounded number of items ahead of the model;
3. group the decoded items `batch_size` at a time and transcribe each group (`asr.transcription.Transcriber`);
4. append each item's row (a failed item gets an error row) and flush, in input order;
5. with several processes, mark this share done; process 0 merges the shares into the output.
"""

from __future__ import annotations

import logging
import sys
import time
from collections import deque
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from asr.batch.output import OutputLock, RowWriter, make_row, read_done_ids
from asr.batch.shards import (
    Processes,
    existing_parts,
    leftovers,
    mark_done,
    marker_path,
    merge_parts,
    part_path,
    wait_for_parts,
)
from asr.batch.sources import Item, iter_items, load_item_audio
from asr.errors import first_line
from asr.options import TranscribeOptions

if TYPE_CHECKING:
    from asr.models.registry import WhisperBundle
    from asr.transcription import Transcriber, WindowAssistant

logger = logging.getLogger(__name__)

# Files that make a folder a saved `datasets` dataset (mirrors asr.batch.sources.iter_items).
_DATASET_FILES = ("dataset_info.json", "dataset_dict.json", "state.json")


@dataclass(frozen=True)
class BatchOptions:
    """How to run a batch; what to transcribe is in `TranscribeOptions`."""

    # Dataset sources: the audio and reference columns, and the split (default: test, else the first).
    audio_column: str = "audio"
    text_column: str = "text"
    split: str | None = None
    # Items transcribed together, and threads decoding audio ahead of the model (0: decode inline).
    batch_size: int = 1
    workers: int = 2
    # Keep each item's segments (times, tokens, words) in its row.
    segments: bool = False
    # An output that exists already: skip the ids it holds (resume) or start afresh (overwrite); else an error.
    resume: bool = False
    overwrite: bool = False
    # With resume: transcribe again the items whose rows are errors (their old rows are replaced).
    retry_errors: bool = False
    # A progress bar on stderr (process 0 only).
    progress: bool = True

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ValueError(f"--batch-size must be >= 1, got {self.batch_size}")
        if self.workers < 0:
            raise ValueError(f"--workers must be >= 0, got {self.workers}")
        if self.resume and self.overwrite:
            raise ValueError("choose either --resume or --overwrite, not both")
        if self.retry_errors and not self.resume:
            raise ValueError("--retry-errors continues an earlier run: pass --resume with it")


@dataclass
class BatchSummary:
    """What a run did (all processes together, once process 0 has merged)."""

    # Rows written by this run, those among them that are errors, and items skipped as already done.
    written: int = 0
    failed: int = 0
    skipped: int = 0
    # Audio transcribed by this run, and the run's wall time (load excluded).
    audio_seconds: float = 0.0
    wall_seconds: float = 0.0
    processes: int = 1
    # Rows in the output file at the end (known once it is complete).
    rows_in_file: int | None = None

    @property
    def rtf(self) -> float:
        """Real-time factor: wall time / audio time (lower is faster)."""
        return self.wall_seconds / self.audio_seconds if self.audio_seconds else 0.0

    def add(self, other: BatchSummary) -> None:
        for name in ("written", "failed", "skipped", "audio_seconds"):
            setattr(self, name, getattr(self, name) + getattr(other, name))

    def describe(self, output: str | Path) -> str:
        """The end-of-run summary line."""
        done = self.written - self.failed
        text = (f"{self.written} item(s) -> {output}: {done} transcribed, {self.failed} failed"
                f"{f', {self.skipped} already done' if self.skipped else ''}; "
                f"{self.audio_seconds / 3600:.2f} h ({self.audio_seconds:.1f} s) of audio in {self.wall_seconds:.1f} s, "
                f"RTF {self.rtf:.3f}")
        if self.processes > 1:
            text += f" ({self.processes} processes)"
        if self.rows_in_file is not None:
            text += f"; {self.rows_in_file} row(s) in the file"
        return text


def prepare_output(output: Path, options: BatchOptions, processes: Processes = Processes()) -> OutputLock | None:
    """Checks the output before any work: what exists is resumed, overwritten, or refused.

    Every process runs this before the start barrier and before any writes, so all see the same files.
    Process 0 first takes the output's lock (`OutputLock`) and returns it: hold it until the run is over, so
    that no other run can pass this check, or delete the files, while this one works.

    Raises:
        ValueError: another run holds the output, the output cannot be written, or results (or parts of them)
            exist and neither resume nor overwrite was asked for.
    """
    if output.is_dir():
        raise ValueError(f"{output}: is a folder; --output names a .jsonl file")
    lock = OutputLock(output).acquire() if processes.is_main else None
    try:
        _check_output(output, options, processes)
    except BaseException:
        if lock is not None:
            lock.release()
        raise
    return lock


def _check_output(output: Path, options: BatchOptions, processes: Processes) -> None:
    found = [output] * output.exists() + existing_parts(output)
    if found and not (options.resume or options.overwrite):
        raise ValueError(f"{found[0]}: results of an earlier run exist; pass --resume to continue them, "
                         "--overwrite to start again, or delete them")
    if options.overwrite and processes.is_main:
        for path in [output] * output.exists() + leftovers(output):
            path.unlink(missing_ok=True)
    if processes.count > 1:
        # A marker left by an earlier run must not pass for this run's (process 0 waits for markers).
        marker_path(part_path(output, processes.index, processes.count)).unlink(missing_ok=True)


def run_batch(source: str, output: str | Path, bundle: WhisperBundle, assistant: WindowAssistant | None = None,
              options: TranscribeOptions = TranscribeOptions(), batch: BatchOptions = BatchOptions(),
              processes: Processes = Processes()) -> BatchSummary:
    """Transcribes this process's share of `source` into `output` (see the module docstring for the steps).

    Args:
        source: a folder, a JSONL/CSV manifest, or a dataset (see `asr.batch.sources.iter_items`).
        output: the JSONL results file; with several processes, each writes a part and process 0 merges them.
        bundle: the loaded model; assistant: its assistant or None.
        options: how to transcribe each item.
        batch: how to run.
        processes: this process's place (`asr.batch.shards.detect_processes()`).

    Returns:
        The run's figures; on process 0 of several, those of all processes.

    Raises:
        ValueError: a source that cannot be read, or options the model cannot honour (before any compute).
    """
    from asr.transcription import Transcriber

    start = time.perf_counter()
    transcriber = Transcriber(bundle, options, assistant)  # the options checked against the model, once
    output = Path(output)
    own = output if processes.count == 1 else part_path(output, processes.index, processes.count)
    summary = BatchSummary(processes=processes.count)
    order: list[str] = []
    _probe(source, batch)  # a source that cannot be read fails before any file is made

    from tqdm import tqdm

    with OutputLock(output) if processes.is_main else nullcontext(), RowWriter(own) as writer:
        # Step 1: this process's share, less what is done. Its own file is repaired only once it holds the lock.
        done = set()
        if batch.resume:
            done = writer.resume(batch.retry_errors) | _done_elsewhere(output, own, processes, batch.retry_errors)
        share = _share(source, batch, processes, done, order, summary)
        bar = tqdm(total=_share_size(source, batch, processes, done), unit="item", file=sys.stderr,
                   desc=f"process 0/{processes.count}" if processes.count > 1 else "batch", dynamic_ncols=True,
                   disable=not (batch.progress and processes.is_main))
        with bar:
            # Steps 2 and 3: decode ahead in threads, then transcribe a batch at a time.
            decoded = _decode_ahead(share, batch.workers, depth=batch.batch_size + max(batch.workers, 1))
            for chunk in _chunks(decoded, batch.batch_size):
                # Step 4: rows in input order, each one whole line; then to disk.
                for row, seconds in _transcribe_chunk(transcriber, chunk, batch.segments):
                    writer.write(row)
                    summary.written += 1
                    summary.failed += row["error"] is not None
                    summary.audio_seconds += seconds
                    bar.update(1)
                writer.sync()
                elapsed = time.perf_counter() - start
                bar.set_postfix_str(f"{summary.audio_seconds / elapsed:.1f} audio-s/s, {summary.failed} failed")
    summary.wall_seconds = time.perf_counter() - start
    # Step 5: shares into one file.
    if processes.count > 1:
        mark_done(own, asdict(summary))
    if processes.is_main and (processes.count > 1 or existing_parts(output)):
        if processes.count > 1:
            for figures in wait_for_parts(output, processes.count)[1:]:
                summary.add(BatchSummary(**figures))
        summary.rows_in_file = merge_parts(output, order)
        summary.wall_seconds = time.perf_counter() - start
    return summary


def _done_elsewhere(output: Path, own: Path, processes: Processes, retry_errors: bool) -> set[str]:
    """Ids already in the output or in parts of earlier runs (other shares of this run hold other items)."""
    this_run = {part_path(output, k, processes.count) for k in range(processes.count)}
    done: set[str] = set()
    for other in [output, *existing_parts(output)]:
        if other != own and other not in this_run:
            done |= read_done_ids(other, drop_errors=retry_errors)
    return done


def _probe(source: str, batch: BatchOptions) -> None:
    """Reads the source's first item: a missing or unreadable source is an error before any work.

    Raises:
        ValueError: no such source, one of no known kind, or one without items.
    """
    if next(iter_items(source, audio_column=batch.audio_column, text_column=batch.text_column, split=batch.split),
            None) is None:
        raise ValueError(f"{source}: no items to transcribe (no audio files, or an empty manifest)")


def _items(source: str, batch: BatchOptions, warn: bool = True) -> Iterator[Item]:
    """The source's items with unique ids: a repeated id gets `#2`, `#3`, ... so that each row can be resumed."""
    seen: dict[str, int] = {}
    for item in iter_items(source, audio_column=batch.audio_column, text_column=batch.text_column, split=batch.split):
        seen[item.id] = seen.get(item.id, 0) + 1
        if seen[item.id] > 1:
            if warn:
                logger.warning("%s: id %r appears again; this row is %r", source, item.id, f"{item.id}#{seen[item.id]}")
            item = replace(item, id=f"{item.id}#{seen[item.id]}")
        yield item


def _share(source: str, batch: BatchOptions, processes: Processes, done: set[str], order: list[str],
           summary: BatchSummary) -> Iterator[Item]:
    """Step 1: this process's items that are not done yet; records every id, in order, into `order`."""
    for position, item in enumerate(_items(source, batch)):
        order.append(item.id)
        if not processes.owns(position):
            continue
        if item.id in done:
            summary.skipped += 1
            continue
        yield item


def _share_size(source: str, batch: BatchOptions, processes: Processes, done: set[str]) -> int | None:
    """How many items this process will transcribe, for the progress bar; None for datasets (costly to count)."""
    path = Path(source).expanduser()
    if not (path.is_file() or (path.is_dir() and not any((path / name).is_file() for name in _DATASET_FILES))):
        return None
    return sum(processes.owns(position) and item.id not in done
               for position, item in enumerate(_items(source, batch, warn=False)))


def _decode(item: Item) -> tuple[np.ndarray | None, str | None]:
    """An item's audio, or why it has none (one line)."""
    try:
        return load_item_audio(item), None
    except ValueError as error:  # audio.AudioError: missing, corrupt, empty, undecodable
        return None, first_line(str(error))
    except Exception as error:  # a decoder library failing on odd bytes: still only this item's problem
        logger.debug("decoding %s failed", item.display, exc_info=True)
        return None, first_line(f"{item.display}: cannot decode ({type(error).__name__}: {error})")


def _decode_ahead(items: Iterator[Item], workers: int, depth: int) -> Iterator[tuple[Item, np.ndarray | None, str | None]]:
    """Decodes items in `workers` threads, at most `depth` items ahead of the consumer; yields in input order."""
    if workers == 0:
        for item in items:
            yield item, *_decode(item)
        return
    pool = ThreadPoolExecutor(workers, thread_name_prefix="asr-decode")
    pending: deque = deque()
    try:
        for item in items:
            pending.append((item, pool.submit(_decode, item)))
            if len(pending) >= depth:
                first, future = pending.popleft()
                yield first, *future.result()
        while pending:
            first, future = pending.popleft()
            yield first, *future.result()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _chunks(decoded: Iterator[tuple[Item, np.ndarray | None, str | None]], batch_size: int) -> Iterator[list]:
    """Runs of consecutive items holding `batch_size` decoded audios (failed items ride along, keeping the order)."""
    chunk: list = []
    good = 0
    for entry in decoded:
        chunk.append(entry)
        good += entry[1] is not None
        if good == batch_size:
            yield chunk
            chunk, good = [], 0
    if chunk:
        yield chunk


def _transcribe_chunk(transcriber: Transcriber, chunk: list, with_segments: bool) -> Iterator[tuple[dict[str, Any], float]]:
    """(row, audio seconds) for each item of a chunk, in order."""
    from audio import SAMPLE_RATE

    audios = [audio for _, audio, _ in chunk if audio is not None]
    results = iter(_transcribe(transcriber, audios) if audios else [])
    for item, audio, error in chunk:
        if audio is None:
            yield make_row(item, None, error, with_segments), 0.0
            continue
        result = next(results)
        if isinstance(result, str):
            yield make_row(item, None, f"{item.display}: {result}", with_segments), 0.0
        else:
            yield make_row(item, result, None, with_segments), len(audio) / SAMPLE_RATE


def _transcribe(transcriber: Transcriber, audios: list[np.ndarray]) -> list:
    """Transcripts of `audios`; when a batch fails, its items are retried alone and a failing one gets its error."""
    try:
        return transcriber.transcribe_many(audios, batch_size=max(len(audios), 1))
    except Exception as error:
        if isinstance(error, MemoryError) or "out of memory" in str(error).lower():
            raise  # the machine's problem, not the item's: stop, and let --resume continue later
        if len(audios) == 1:
            logger.warning("transcription failed: %s: %s", type(error).__name__, first_line(str(error)))
            logger.debug("traceback", exc_info=True)
            return [first_line(f"transcription failed ({type(error).__name__}: {error})")]
        logger.warning("a batch of %d failed (%s); transcribing its items one by one", len(audios), first_line(str(error)))
        return [result for audio in audios for result in _transcribe(transcriber, [audio])]
