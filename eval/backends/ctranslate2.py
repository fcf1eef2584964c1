"""faster-whisper (CTranslate2) as an evaluation backend: the outside speed anchor, in a worker process of its own."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
from pathlib import Path
from typing import Any

import numpy as np

from asr.errors import first_line
from eval.configs import EvalConfig
from eval.backends.decoded import BackendUnavailable, Decoded

# The one hint for installing faster-whisper, the outside speed anchor (pyproject's `baselines` extra).
INSTALL_HINT = 'pip install -e ".[baselines]" (or pip install faster-whisper)'


class FasterWhisperBackend:
    """faster-whisper (CTranslate2) on the same weights, greedy: beam 1 (`beam=N`: N beams), the same temperature
    fallback; with `batched=N` its `BatchedInferencePipeline` (its VAD, chunks of 30 s, its defaults otherwise).

    It runs in a process of its own, as its users run it: once CTranslate2 had decoded in our process, PyTorch's
    decoding there took markedly longer for the rest of the run (two OpenMP runtimes and two oneDNN copies in
    one process; the cause was not pinned down), which would make every comparison unfair to one side.
    The samples go to it through a pipe (milliseconds for minutes of audio) inside the timed call.
    """

    def __init__(self, config: EvalConfig, model_name: str, device: str, threads: int) -> None:
        try:
            import faster_whisper  # noqa: F401  (whether it is installed; the model loads in the worker)
        except ImportError:
            raise BackendUnavailable(f"the faster-whisper package is not installed ({INSTALL_HINT})") from None
        folder = ct2_folder(model_name)
        if folder is None:
            raise BackendUnavailable(f"model {model_name!r} has no CTranslate2 (faster-whisper) form here")
        self.config = config
        on_gpu = device.startswith("cuda")
        # The weights are float16; on a CPU CTranslate2 would compute in float32 anyway (and warn about it).
        compute_type = config.compute_type or ("default" if on_gpu else "float32")
        context = multiprocessing.get_context("spawn")
        self._connection, child = context.Pipe()
        self._process = context.Process(
            target=_faster_whisper_worker, daemon=True,
            args=(child, str(folder), "cuda" if on_gpu else "cpu", compute_type, threads, config.batch_size,
                  config.beam_size or 1))
        self._process.start()
        child.close()
        kind, message = self._receive()
        if kind != "ready":
            self.close()
            raise BackendUnavailable(f"faster-whisper cannot load {folder}: {message}")

    def decode(self, samples: np.ndarray, language: str | None) -> Decoded:
        self._connection.send((samples, language))
        kind, payload = self._receive()
        if kind != "ok":
            raise RuntimeError(f"faster-whisper: {payload}")
        text, detected, tokens = payload
        return Decoded(text=text, language=detected, generated_tokens=tokens)

    def close(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            self._connection.send(None)
        self._process.join(timeout=10)
        if self._process.is_alive():
            self._process.kill()

    def _receive(self) -> tuple[str, Any]:
        try:
            return self._connection.recv()
        except EOFError:
            return "error", f"its worker process ended (exit code {self._process.exitcode})"


def _faster_whisper_worker(connection: Any, folder: str, device: str, compute_type: str, threads: int,
                           batch_size: int | None, beam_size: int = 1) -> None:
    """The faster-whisper side of `FasterWhisperBackend`: loads the model, then decodes what comes down the pipe
    until None (or the pipe closes)."""
    try:
        from faster_whisper import BatchedInferencePipeline, WhisperModel

        model = WhisperModel(folder, device=device, compute_type=compute_type, cpu_threads=threads,
                             local_files_only=True)
        pipeline = BatchedInferencePipeline(model) if batch_size is not None else None
    except Exception as error:  # CTranslate2 names a compute type it cannot use here, among others
        connection.send(("error", f"{type(error).__name__}: {first_line(error)}"))
        return
    connection.send(("ready", None))
    while True:
        try:
            request = connection.recv()
        except EOFError:
            return
        if request is None:
            return
        samples, language = request
        try:
            if pipeline is not None:
                segments, info = pipeline.transcribe(samples, language=language, beam_size=beam_size,
                                                     batch_size=batch_size)
            else:
                segments, info = model.transcribe(samples, language=language, beam_size=beam_size, vad_filter=False)
            segments = list(segments)  # the generator decodes as it is consumed
            connection.send(("ok", ("".join(s.text for s in segments), info.language,
                                    sum(len(s.tokens) for s in segments))))
        except Exception as error:  # one failed item, reported by the runner like any other backend's
            connection.send(("error", f"{type(error).__name__}: {error}"))


def ct2_folder(model_name: str) -> Path | None:
    """A folder faster-whisper can load for `model_name` (a CTranslate2 folder, or an installed package), or None.

    A package that ships `model.bin` in parts (`base`) is joined once into the conversion cache.
    """
    from asr.models.cache import cache_dir, package_source

    path = Path(model_name).expanduser()
    if path.is_dir():
        return path if (path / "model.bin").is_file() else None
    source = package_source(model_name)
    if source is None:
        return None
    files = source.model_files
    if len(files) == 1 and files[0].name == "model.bin" and files[0].parent == source.config_json.parent:
        return files[0].parent
    folder = cache_dir() / f"faster-whisper-{model_name}"
    _join_parts(files, source.config_json.parent, folder)
    return folder


def _join_parts(parts: tuple[Path, ...], data: Path, folder: Path) -> None:
    """Writes `folder/model.bin` from its parts (atomically) beside links to the other files in `data`."""
    folder.mkdir(parents=True, exist_ok=True)
    for file in data.iterdir():
        if file.is_file() and not file.name.startswith("model.bin"):
            target = folder / file.name
            if not target.exists():
                with contextlib.suppress(FileExistsError):
                    target.symlink_to(file.resolve())
    joined = folder / "model.bin"
    size = sum(p.stat().st_size for p in parts)
    if joined.is_file() and joined.stat().st_size == size:
        return
    partial = folder / f".model.bin.{os.getpid()}"
    with open(partial, "wb") as out:
        for part in parts:
            with open(part, "rb") as handle:
                while chunk := handle.read(1 << 24):
                    out.write(chunk)
    os.replace(partial, joined)
