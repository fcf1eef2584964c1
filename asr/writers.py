"""Writing transcripts as txt, srt, vtt, tsv and json, named as openai-whisper names them."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Callable, TextIO

from asr.results import Transcript

FORMATS = ("txt", "srt", "vtt", "tsv", "json")


def format_timestamp(seconds: float, always_include_hours: bool = False, decimal_marker: str = ".") -> str:
    """Seconds as [HH:]MM:SS.mmm (SRT uses a comma and always shows hours)."""
    milliseconds = max(0, round(seconds * 1000.0))
    hours, milliseconds = divmod(milliseconds, 3_600_000)
    minutes, milliseconds = divmod(milliseconds, 60_000)
    secs, milliseconds = divmod(milliseconds, 1_000)
    hours_marker = f"{hours:02d}:" if always_include_hours or hours > 0 else ""
    return f"{hours_marker}{minutes:02d}:{secs:02d}{decimal_marker}{milliseconds:03d}"


def write_txt(transcript: Transcript, file: TextIO) -> None:
    for segment in transcript.segments:
        print(segment.text.strip(), file=file, flush=True)


def write_vtt(transcript: Transcript, file: TextIO) -> None:
    print("WEBVTT\n", file=file)
    for segment in transcript.segments:
        print(f"{format_timestamp(segment.start)} --> {format_timestamp(segment.end)}\n"
              f"{segment.text.strip().replace('-->', '->')}\n", file=file, flush=True)


def write_srt(transcript: Transcript, file: TextIO) -> None:
    for index, segment in enumerate(transcript.segments, start=1):
        start = format_timestamp(segment.start, always_include_hours=True, decimal_marker=",")
        end = format_timestamp(segment.end, always_include_hours=True, decimal_marker=",")
        print(f"{index}\n{start} --> {end}\n{segment.text.strip().replace('-->', '->')}\n", file=file, flush=True)


def write_tsv(transcript: Transcript, file: TextIO) -> None:
    """Start and end in integer milliseconds, then the text (openai-whisper's TSV)."""
    print("start", "end", "text", sep="\t", file=file)
    for segment in transcript.segments:
        print(round(1000 * segment.start), round(1000 * segment.end),
              segment.text.strip().replace("\t", " "), sep="\t", file=file, flush=True)


def write_json(transcript: Transcript, file: TextIO) -> None:
    json.dump(transcript.to_dict(), file, ensure_ascii=False)
    file.write("\n")


WRITERS: dict[str, Callable[[Transcript, TextIO], None]] = {
    "txt": write_txt, "srt": write_srt, "vtt": write_vtt, "tsv": write_tsv, "json": write_json,
}


def output_formats(name: str) -> tuple[str, ...]:
    """`all` or one format name -> the formats to write.

    Raises:
        ValueError: an unknown format.
    """
    if name == "all":
        return FORMATS
    if name not in WRITERS:
        raise ValueError(f"unknown output format {name!r}; choose one of {', '.join(FORMATS)}, all")
    return (name,)


def write_outputs(transcript: Transcript, audio_path: str, output_dir: str | os.PathLike, formats: tuple[str, ...]) -> list[Path]:
    """Writes `DIR/<audio stem>.<format>` for each format, each through a temporary file so none is half-written."""
    folder = Path(output_dir)
    folder.mkdir(parents=True, exist_ok=True)
    stem = Path(audio_path).stem
    written = []
    for fmt in formats:
        path = folder / f"{stem}.{fmt}"
        partial = path.with_name(path.name + ".partial")
        with open(partial, "w", encoding="utf-8") as file:
            WRITERS[fmt](transcript, file)
        os.replace(partial, path)
        written.append(path)
    return written
