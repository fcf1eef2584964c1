"""What the benchmark scripts share: timing, the evaluation recordings, the machine, and the figure files.

The scripts run as `python scripts/NAME.py` from the repository root, so this folder is first on `sys.path`
and `from benchlib import ...` finds this module; importing it puts the repository root on `sys.path` too,
so `import asr` works without installing the package.

Figures go to `docs/figures/NAME.json` (the data, the machine and the command) and `docs/figures/NAME.md`
(the command and the machine on the first line, then the Markdown table); `scripts/render_docs.py` copies
each `.md` into the docs between `<!-- figure: NAME -->` and `<!-- /figure -->`.
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(1, str(REPO))

from audio.constants import SAMPLE_RATE  # (after the repository root is on sys.path)

FIGURES = REPO / "docs" / "figures"
# The evaluation recordings: ../shared/evaldata beside the checkout, or $ASSISTED_WHISPER_EVALDATA.
EVALDATA = Path(os.environ.get("ASSISTED_WHISPER_EVALDATA") or REPO.parent / "shared" / "evaldata")
SONNETS = ("p001.mp3", "p002.mp3", "p003.mp3")
VOXPOPULI = "voxpopuli-en-000.ogg"

__all__ = ["EVALDATA", "FIGURES", "REPO", "SAMPLE_RATE", "SONNETS", "VOXPOPULI", "command_line", "figure_path",
           "figure_stem", "free_port", "load", "longform_audio", "longform_rows", "machine", "machine_line",
           "markdown_page", "read_figures", "rewrite_markdown", "sonnets", "sonnets_reference", "timed",
           "use_threads", "wer_items", "wer_percent", "write_figures"]


# --- timing -------------------------------------------------------------------------------------------------


def use_threads(threads: int) -> None:
    """Torch on `threads` CPU threads, with oneDNN's kernel caches bounded as the command line bounds them
    (`decoding.kernels.products.limit_kernel_caches`: they decide a bfloat16 or int8 run's memory)."""
    import torch

    from decoding.kernels.products import limit_kernel_caches

    limit_kernel_caches()
    torch.set_num_threads(threads)

def timed(fn: Callable[[], Any], repeats: int, *, warmup: int = 1, mean: bool = False,
          sync: Callable[[], None] | None = None, results: list | None = None) -> float:
    """Seconds per call of `fn()` after `warmup` untimed calls.

    The median of `repeats` calls timed one by one; with `mean=True`, one clock around `repeats` calls back to
    back, divided by `repeats`. `sync` (e.g. `torch.cuda.synchronize`) is called before and after what is
    timed; `results`, when given, receives what each timed call returned.
    """
    for _ in range(warmup):
        fn()
    sync = sync or (lambda: None)
    if mean:
        sync()
        start = time.perf_counter()
        for _ in range(repeats):
            out = fn()
            if results is not None:
                results.append(out)
        sync()
        return (time.perf_counter() - start) / repeats
    times = []
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        out = fn()
        sync()
        times.append(time.perf_counter() - start)
        if results is not None:
            results.append(out)
    return statistics.median(times)


# --- recordings ---------------------------------------------------------------------------------------------

def load(path: str | Path):
    """One recording as 16 kHz float32 samples (`audio.load_audio`); a relative path is under EVALDATA."""
    from audio import load_audio

    return load_audio(EVALDATA / path)


def sonnets():
    """The three sonnets of `longform/` joined (158 s), 16 kHz float32."""
    import numpy as np

    return np.concatenate([load(Path("longform") / name) for name in SONNETS])


def longform_rows() -> dict[str, dict]:
    """The rows of `longform/manifest.jsonl` by audio file name."""
    lines = (EVALDATA / "longform" / "manifest.jsonl").read_text(encoding="utf-8").splitlines()
    return {row["audio"]: row for row in map(json.loads, filter(str.strip, lines))}


def sonnets_reference() -> str:
    """The words of the three sonnets (each one's `text_body`, without the reader's announcements), joined."""
    rows = longform_rows()
    return " ".join(rows[name]["text_body"] for name in SONNETS)


def longform_audio(name: str):
    """A file of `longform/` as 16 kHz float32 samples and its reference text ("sonnets": the three joined, their
    words without the reader's announcements)."""
    if name == "sonnets":
        return sonnets(), sonnets_reference()
    return load(Path("longform") / name), longform_rows()[name]["text"]


def wer_percent(reference: str, hypothesis: str) -> float:
    """Word error rate in percent, both texts normalised as `asr eval` does (`eval.normalize`)."""
    import jiwer

    from eval.normalize import normalize

    return 100 * jiwer.wer(normalize(reference), normalize(hypothesis))


def wer_items(folders: Iterable[str], max_seconds: float | None = None, language: str | None = "en",
              skip_missing: bool = False) -> list[dict]:
    """The recordings fit for WER (`eval_use == "wer"`) in `language` (None: every language), folder by folder,
    in manifest order.

    Each item: id (`FOLDER/FILE`), audio (an absolute path), text, language, subset (the folder), duration_s.
    `max_seconds` leaves out longer recordings; `skip_missing` leaves out (with a note) folders without a
    manifest instead of failing.
    """
    items = []
    for folder in folders:
        manifest = EVALDATA / folder / "manifest.jsonl"
        if skip_missing and not manifest.is_file():
            print(f"{manifest} not found, left out", file=sys.stderr)
            continue
        for line in manifest.read_text(encoding="utf-8").splitlines():
            row = json.loads(line) if line.strip() else None
            if not row or row.get("eval_use") != "wer" or language not in (None, row.get("language")):
                continue
            if max_seconds is not None and row["duration_s"] > max_seconds:
                continue
            items.append({"id": f"{folder}/{row['audio']}", "audio": str(EVALDATA / folder / row["audio"]),
                          "text": row["text"], "language": row.get("language"), "subset": folder,
                          "duration_s": row.get("duration_s")})
    return items


# --- the machine and the figure files -----------------------------------------------------------------------

def _cpu_name() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
        for line in out.splitlines():
            if line.startswith("Model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _version(package: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return None


def machine() -> dict:
    """The CPU, torch's thread count (the cores when torch is not imported), the GPU when torch uses one, the
    versions of torch, transformers and faster-whisper (None when not installed), and the UTC time."""
    torch = sys.modules.get("torch")
    found = {"cpu": _cpu_name(), "cores": os.cpu_count(),
             "threads": torch.get_num_threads() if torch else os.cpu_count()}
    if torch is not None and torch.cuda.is_available():
        found["gpu"] = torch.cuda.get_device_name()
    found.update({"python": platform.python_version(),
                  "torch": torch.__version__ if torch else _version("torch"),
                  "transformers": _version("transformers"), "faster_whisper": _version("faster-whisper"),
                  "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())})
    return found


def machine_line(found: dict) -> str:
    """One line of a `machine()` dict: 'AMD EPYC, 2 threads, torch 2.13.0+cpu, ..., 2026-11-30 18:07 UTC'."""
    parts = [found[key] for key in ("device", "cpu", "gpu") if found.get(key)]
    if found.get("threads") is not None:
        parts.append(f"{found['threads']} threads")
    for key, name in (("torch", "torch"), ("transformers", "transformers"), ("faster_whisper", "faster-whisper")):
        if found.get(key):
            parts.append(f"{name} {found[key]}")
    if found.get("date"):
        parts.append(found["date"])
    return ", ".join(parts)


def free_port() -> int:
    """A loopback port free now (for a server or a process group a benchmark starts)."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def command_line(script: str | None = None) -> str:
    """This run's command as typed from the repository root: `python scripts/NAME.py ARGS`."""
    name = Path(script or sys.argv[0]).name
    return shlex.join(["python", f"scripts/{name}", *sys.argv[1:]])


def figure_path(name: str) -> Path:
    """docs/figures/NAME (no suffix): the default --out of a script."""
    return FIGURES / name


def figure_stem(out: Path | str) -> Path:
    """OUT without a .json or .md ending: the figure files are OUT.json and OUT.md."""
    out = Path(out)
    return out.with_suffix("") if out.suffix in (".json", ".md") else out


def markdown_page(command: str, found: dict, table: str) -> str:
    """A figure file's Markdown: the command in backticks and the machine, a blank line, the table."""
    return f"`{command}` — {machine_line(found)}\n\n{table.strip()}\n"


def write_figures(out: Path | str, data: dict, table: str, command: str, found: dict | None = None) -> Path:
    """Write OUT.json ({"command", "machine", **data}) and OUT.md (`markdown_page`); returns OUT.md.

    `found` is the machine to record (default `machine()` now); OUT may end in .json or .md or neither.
    """
    stem = figure_stem(out)
    found = found or machine()
    clash = {"command", "machine"} & set(data)
    if clash:
        raise ValueError(f"data may not have the keys {sorted(clash)}")
    stem.parent.mkdir(parents=True, exist_ok=True)
    Path(f"{stem}.json").write_text(json.dumps({"command": command, "machine": found, **data}, indent=1) + "\n")
    md = Path(f"{stem}.md")
    md.write_text(markdown_page(command, found, table))
    return md


def read_figures(out: Path | str) -> dict:
    """OUT.json as `write_figures` wrote it."""
    return json.loads(Path(f"{figure_stem(out)}.json").read_text())


def rewrite_markdown(out: Path | str, table_of: Callable[[dict], str]) -> Path:
    """Rewrite OUT.md from OUT.json (an earlier run's command and machine, `table_of(data)` as the table)."""
    data = read_figures(out)
    md = Path(f"{figure_stem(out)}.md")
    md.write_text(markdown_page(data["command"], data["machine"], table_of(data)))
    return md


if __name__ == "__main__":
    import argparse

    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    print(f"EVALDATA {EVALDATA}\nfigures  {FIGURES}\nmachine  {machine_line(machine())}")
