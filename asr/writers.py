"""Writing transcripts as txt, srt, vtt, tsv and json, named as openai-whisper names them."""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from asr.results import Segment, Transcript, Word

FORMATS = ("txt", "srt", "vtt", "tsv", "json")
# Without both a line width and a line count, each segment starts a new cue; with both, words flow across
# segments and a pause longer than this (seconds) starts a new cue (openai-whisper's rule).
LONG_PAUSE_SECONDS = 3.0


@dataclass(frozen=True)
class SubtitleOptions:
    """Layout of srt and vtt cues from word timestamps (openai-whisper's `--max_line_width` and friends).

    They act only on a transcript with word timestamps; without words each segment is one cue, as before.
    With words, cue times come from the words (openai-whisper's writers do the same).

    Attributes:
        max_line_width: Characters in a line before it breaks (None: no limit). Each segment is its own cue
            unless `max_line_count` is given too; then words flow across segments into cues of that many lines.
        max_line_count: Lines in a cue; needs `max_line_width` (no effect without it).
        max_words_per_line: Words in a cue (one line each); no effect with `max_line_width`.
        highlight_words: Underline each word while it is spoken: one cue per word, `<u>word</u>`.
    """

    max_line_width: int | None = None
    max_line_count: int | None = None
    max_words_per_line: int | None = None
    highlight_words: bool = False

    def __post_init__(self) -> None:
        for name in ("max_line_width", "max_line_count", "max_words_per_line"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be a positive integer, got {value!r}")

    @property
    def given(self) -> tuple[str, ...]:
        """Names of the options that are set."""
        return tuple(name for name in ("max_line_width", "max_line_count", "max_words_per_line", "highlight_words")
                     if getattr(self, name))

    def ineffective(self) -> list[str]:
        """One line for each option that the others make moot."""
        notes = []
        if self.max_line_count is not None and self.max_line_width is None:
            notes.append("max_line_count has no effect without max_line_width")
        if self.max_words_per_line is not None and self.max_line_width is not None:
            notes.append("max_words_per_line has no effect with max_line_width")
        return notes


def subtitle_cues(transcript: Transcript, options: SubtitleOptions | None = None) -> Iterator[tuple[float, float, str]]:
    """(start, end, text) of each srt/vtt cue: one per segment, or laid out from the words by `options`."""
    for start, end, text in _cues(transcript.segments, options or SubtitleOptions()):
        if text:  # a cue of nothing but white space would be a blank cue
            yield start, end, text


def _cues(segments: list[Segment], options: SubtitleOptions) -> Iterator[tuple[float, float, str]]:
    if not any(segment.words for segment in segments):
        for segment in segments:
            yield segment.start, segment.end, _cue_text(segment.text.strip())
        return
    for cue in _word_cues(segments, options):
        text = _cue_text("".join(word.word for word in cue))
        if not options.highlight_words:
            yield cue[0].start, cue[-1].end, text
            continue
        shown_until = cue[0].start
        for index, word in enumerate(cue):
            if _ms(shown_until) != _ms(word.start):  # a gap between words: the cue without underline
                yield shown_until, word.start, text
            underlined = [_underline(w.word) if i == index else w.word for i, w in enumerate(cue)]
            yield word.start, word.end, _cue_text("".join(underlined))
            shown_until = word.end


def _word_cues(segments: list[Segment], options: SubtitleOptions) -> Iterator[list[Word]]:
    """Groups the words into cues; each word's text carries its line break ("\n") or leading space."""
    flowing = options.max_line_width is not None and options.max_line_count is not None
    width = options.max_line_width or math.inf
    per_cue = options.max_words_per_line if options.max_line_width is None else None
    cue: list[Word] = []
    line_length, lines = 0, 1
    last_start = next((w.start for s in segments for w in s.words or ()), segments[0].start)
    for segment in segments:
        for index, word in enumerate(_segment_words(segment)):
            text = word.word
            new_chunk = not flowing and bool(cue) and (index == 0 or (per_cue is not None and index % per_cue == 0))
            long_pause = flowing and word.start - last_start > LONG_PAUSE_SECONDS
            if line_length > 0 and line_length + len(text) <= width and not long_pause and not new_chunk:
                line_length += len(text)
            else:
                text = text.strip()
                if cue and (new_chunk or (flowing and (long_pause or lines >= options.max_line_count))):
                    yield cue
                    cue, lines = [], 1
                elif line_length > 0:
                    lines += 1
                    text = "\n" + text
                line_length = len(text.strip())
            cue.append(Word(text, word.start, word.end, word.probability))
            last_start = word.start
    if cue:
        yield cue


def _segment_words(segment: Segment) -> list[Word]:
    """The segment's words; a segment without words (but with text) counts as one word."""
    if segment.words:
        return segment.words
    text = segment.text.strip()
    return [Word(" " + text, segment.start, segment.end, 1.0)] if text else []


def _underline(word: str) -> str:
    return re.sub(r"^(\s*)(.*)$", r"\1<u>\2</u>", word, flags=re.DOTALL)


def _cue_text(text: str) -> str:
    """A cue's text as players read it: no "-->" (it would read as a cue's times), and no blank or padded lines
    (a blank line ends a cue, whatever text follows)."""
    lines = (line.strip() for line in re.sub(r"--+>", "->", text).splitlines())
    return "\n".join(line for line in lines if line)


def _ms(seconds: float) -> int:
    return max(0, round(seconds * 1000.0))


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


def write_vtt(transcript: Transcript, file: TextIO, subtitles: SubtitleOptions | None = None) -> None:
    print("WEBVTT\n", file=file)
    for start, end, text in subtitle_cues(transcript, subtitles):
        print(f"{format_timestamp(start)} --> {format_timestamp(end)}\n{text}\n", file=file, flush=True)


def write_srt(transcript: Transcript, file: TextIO, subtitles: SubtitleOptions | None = None) -> None:
    for index, (start, end, text) in enumerate(subtitle_cues(transcript, subtitles), start=1):
        start_text = format_timestamp(start, always_include_hours=True, decimal_marker=",")
        end_text = format_timestamp(end, always_include_hours=True, decimal_marker=",")
        print(f"{index}\n{start_text} --> {end_text}\n{text}\n", file=file, flush=True)


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
SUBTITLE_FORMATS = ("srt", "vtt")


def write_format(fmt: str, transcript: Transcript, file: TextIO, subtitles: SubtitleOptions | None = None) -> None:
    """Writes `transcript` to `file` as `fmt`; `subtitles` lays out srt and vtt cues (the others ignore it)."""
    if fmt in SUBTITLE_FORMATS:
        WRITERS[fmt](transcript, file, subtitles)
    else:
        WRITERS[fmt](transcript, file)


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


def write_outputs(transcript: Transcript, audio_path: str, output_dir: str | os.PathLike, formats: tuple[str, ...],
                  subtitles: SubtitleOptions | None = None, suffix: str = "", stem: str | None = None) -> list[Path]:
    """Writes `DIR/<audio stem><suffix>.<format>` for each format, each through a temporary file so none is
    half-written; `subtitles` lays out the srt and vtt cues, `suffix` (".left") tells channels apart, `stem`
    replaces the audio's stem (`output_stems` makes them unique for several files)."""
    folder = Path(output_dir)
    folder.mkdir(parents=True, exist_ok=True)
    stem = (stem if stem is not None else Path(audio_path).stem) + suffix
    written = []
    for fmt in formats:
        path = folder / f"{stem}.{fmt}"
        partial = path.with_name(path.name + ".partial")
        try:
            with open(partial, "w", encoding="utf-8") as file:
                write_format(fmt, transcript, file, subtitles)
            os.replace(partial, path)
        except BaseException:
            partial.unlink(missing_ok=True)
            raise
        written.append(path)
    return written


def output_stems(paths: list[str]) -> list[str]:
    """A distinct output name for each input path, in order: its stem (`talk`), unless another input has the same stem;
    then its file name (`talk.wav`, `talk.mp3`), unless that is shared too (`d1/x.wav`, `d2/x.wav`); then its
    path below the folders they share, joined by `_` (`d1_x.wav`); a counter as the last resort."""
    stems = [Path(p).stem for p in paths]
    names = [Path(p).name for p in paths]
    chosen: list[str] = []
    taken: set[str] = set()
    for path, stem, name in zip(paths, stems, names):
        if stems.count(stem) == 1:
            candidate = stem
        elif names.count(name) == 1:
            candidate = name
        else:  # the folders below the ones all the same-named inputs share
            same = [os.path.abspath(other) for other, other_name in zip(paths, names) if other_name == name]
            relative = Path(os.path.relpath(os.path.abspath(path), os.path.commonpath(same)))
            candidate = "_".join(part for part in relative.parts if part not in ("..", ".")) or name
        unique, number = candidate, 2
        while unique in taken:
            unique, number = f"{candidate}-{number}", number + 1
        taken.add(unique)
        chosen.append(unique)
    return chosen
