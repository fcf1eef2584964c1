"""Continuous batching across requests: the windows of concurrent requests are decoded together.

One worker thread owns the model. Each request becomes a `Job` (its audio's `AudioProgress`); the worker takes
the kind of decoding (task, temperatures, word times: one `WindowDecoder` each) of the job longest without a
turn and decodes the current window of up to `max_batch` jobs of that kind as one batch, those longest without
a turn first, then moves each job on and hands its new segments to the request. A job that finishes leaves the
batch and a waiting one takes its place before the next decode (`asr.transcription` does the same for the files
of one run). Jobs of one kind share a batch whatever their language or prompt: both are per audio. A request
alone in the batch is drafted by the assistant `--assistant auto` picks; several are decoded as one ragged batch
without it (docs/drafts.md).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from asr.errors import first_line
from asr.options import TranscribeOptions, prompt_texts
from asr.progress import AudioProgress
from asr.whisper.language import resolve_language

if TYPE_CHECKING:
    from asr.models.registry import WhisperBundle
    from asr.transcription import Transcriber

logger = logging.getLogger(__name__)

# Kinds of decoding (`_kind`) whose decoders are kept for the next request of that kind.
KINDS_KEPT = 16


class Busy(RuntimeError):
    """The queue is full: the request is refused (HTTP 503) rather than waiting without bound."""


@dataclass
class Event:
    """What the worker tells a request: new segments, the finished transcript, or why it failed."""

    kind: str  # "segments", "done" or "error"
    value: Any


class Job:
    """One request's audio on its way through the worker; events go to the request's asyncio loop."""

    def __init__(self, audio: AudioProgress, kind: TranscribeOptions, decoder: Any,
                 loop: asyncio.AbstractEventLoop) -> None:
        self.audio = audio
        self.kind = kind
        self.decoder = decoder  # the kind's `WindowDecoder`
        self.events: asyncio.Queue[Event] = asyncio.Queue()
        self.cancelled = False
        self.submitted = time.perf_counter()
        self.last_batch = -1  # the worker's last batch that held this job (-1: none yet)
        self._loop = loop

    def cancel(self) -> None:
        """The client went away: the worker drops the job before its next decode."""
        self.cancelled = True

    def tell(self, kind: str, value: Any) -> None:
        """Hands an event to the request (from the worker thread)."""
        try:
            self._loop.call_soon_threadsafe(self.events.put_nowait, Event(kind, value))
        except RuntimeError:  # the request's loop is closed: nobody is listening
            self.cancelled = True


class Scheduler:
    """The worker thread and its queue; `submit` from request handlers, `compute` for other model work.

    Args:
        bundle: the loaded model; assistant: what `--assistant` resolved to (None: plain decoding).
        max_batch: windows decoded together at most.
        max_queue: requests waiting beyond those being decoded; one more is refused (`Busy`).
    """

    def __init__(self, bundle: WhisperBundle, assistant: Any = None, max_batch: int = 8, max_queue: int = 64) -> None:
        if max_batch < 1 or max_queue < 0:
            raise ValueError(f"max batch must be >= 1 and max queue >= 0, got {max_batch} and {max_queue}")
        self.bundle = bundle
        self.assistant = assistant
        self.max_batch = max_batch
        self.max_queue = max_queue
        # One lock for every pass of the model: the worker's batches and the live sessions' updates.
        self.compute = threading.Lock()
        self._transcribers: OrderedDict[TranscribeOptions, Transcriber] = OrderedDict()
        self._building = threading.Lock()
        self._jobs: list[Job] = []  # in arrival order, each at a window to decode
        self._arrived = threading.Condition()
        self._stopped = False
        self._index = 0
        self.batches = 0  # decodes so far, and windows in them (the server's /health figures)
        self.windows = 0
        self._thread = threading.Thread(target=self._run, name="asr-serve-worker", daemon=True)
        self._thread.start()

    # --- from request handlers ---------------------------------------------------------------------------------

    def check(self, options: TranscribeOptions) -> None:
        """Builds (once per kind) what decoding with `options` needs, checking them against the model.

        Raises:
            ValueError: options the model cannot honour (an unknown language, translation with an English-only
                model, ...).
        """
        resolve_language(options.language, self.bundle)
        self._transcriber(_kind(options))

    def submit(self, samples: np.ndarray, options: TranscribeOptions, loop: asyncio.AbstractEventLoop,
               name: str | None = None) -> Job:
        """Queues an audio for transcription; its events arrive on `job.events` in `loop` (the request's).

        Raises:
            Busy: the queue is full. ValueError: options the model cannot honour.
        """
        kind = _kind(options)
        decoder = self._transcriber(kind).decoder
        language = resolve_language(options.language, self.bundle)
        initial = prompt_texts(options, self.bundle).initial
        with self._arrived:
            if self._stopped:
                raise Busy("the server is shutting down")
            if len(self._jobs) >= self.max_batch + self.max_queue:
                raise Busy(f"the server is busy ({len(self._jobs)} requests in hand); retry later")
            self._index += 1
            audio = AudioProgress(self._index, samples, language, kind, initial, name=name)
            job = Job(audio, kind, decoder, loop)
            self._jobs.append(job)
            self._arrived.notify()
        return job

    @property
    def in_hand(self) -> int:
        """Requests being decoded or waiting."""
        with self._arrived:
            return len(self._jobs)

    def stop(self) -> None:
        """Ends the worker after its current batch; jobs still in hand get an error."""
        with self._arrived:
            self._stopped = True
            self._arrived.notify()
        self._thread.join(timeout=60)

    # --- the worker --------------------------------------------------------------------------------------------

    def _transcriber(self, kind: TranscribeOptions) -> Transcriber:
        from asr.transcription import Transcriber

        with self._building:  # once per kind; building one runs nothing on the model
            if kind not in self._transcribers:
                self._transcribers[kind] = Transcriber(self.bundle, kind, self.assistant)
                if len(self._transcribers) > KINDS_KEPT:  # requests may ask for any temperature: keep a few
                    self._transcribers.popitem(last=False)
            self._transcribers.move_to_end(kind)
            return self._transcribers[kind]

    def _run(self) -> None:
        while True:
            with self._arrived:
                while not self._stopped and not self._jobs:
                    self._arrived.wait()
                if self._stopped:
                    for job in self._jobs:
                        job.tell("error", "the server is shutting down")
                    self._jobs.clear()
                    return
                batch = self._next_batch()
            if batch:
                self._decode(batch)

    def _next_batch(self) -> list[Job]:
        """Up to `max_batch` jobs of one kind, those longest without a turn first; drops cancelled and finished
        jobs (called with the lock held)."""
        kept = []
        for job in self._jobs:
            if job.cancelled:
                logger.info("request %d cancelled: its client went away", job.audio.index)
            elif not job.audio.next_window():
                job.tell("done", job.audio.transcript())
            else:
                kept.append(job)
        self._jobs[:] = kept
        if not kept:
            return []
        # Longest without a turn first (new jobs before any decoded one, then by arrival): with more jobs than
        # places, a long recording yields its place for a batch and a short request is not held up by it.
        waiting = sorted(kept, key=lambda job: (job.last_batch, job.audio.index))
        kind = waiting[0].kind
        return [job for job in waiting if job.kind == kind][: self.max_batch]

    def _decode(self, batch: list[Job]) -> None:
        decoder = batch[0].decoder
        try:
            with self.compute:
                decoder.decode([job.audio for job in batch])
        except Exception as error:
            if isinstance(error, MemoryError) or len(batch) == 1:
                self._fail(batch, error)
                return
            # A batch that fails is decoded again one job at a time: only a job that fails alone fails.
            logger.warning("a batch of %d failed (%s); decoding its requests one by one", len(batch),
                           first_line(str(error)))
            for job in batch:
                self._decode([job])
            return
        for job in batch:
            job.last_batch = self.batches
        self.batches += 1
        self.windows += len(batch)
        for job in batch:
            new = job.audio.take_new_segments()
            if new:
                job.tell("segments", new)

    def _fail(self, batch: list[Job], error: Exception) -> None:
        logger.warning("transcription failed: %s: %s", type(error).__name__, first_line(str(error)))
        logger.debug("traceback", exc_info=True)
        with self._arrived:
            for job in batch:
                job.tell("error", first_line(f"transcription failed ({type(error).__name__}: {error})"))
                if job in self._jobs:
                    self._jobs.remove(job)


def _kind(options: TranscribeOptions) -> TranscribeOptions:
    """What decides how a window is decoded (one `WindowDecoder` each): the options less the per-audio ones."""
    return replace(options, language=None, initial_prompt=None)

