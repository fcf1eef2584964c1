"""`asr transcribe`'s inputs and subtitle layout: `-` for standard input, `--split-stereo`, and openai-whisper's
`--max-line-width`, `--max-line-count`, `--max-words-per-line` and `--highlight-words`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    from asr.models.registry import WhisperBundle
    from asr.options import TranscribeOptions

# The name that audio read from standard input (`asr transcribe -`) has in outputs: -o DIR gets DIR/stdin.<fmt>.
STDIN_NAME = "stdin"
# The channels that --split-stereo transcribes apart, and the suffix of each one's outputs.
STEREO_CHANNELS = ((0, "left"), (1, "right"))

_LAYOUT = ("max_line_width", "max_line_count", "max_words_per_line", "highlight_words")


def subtitle_options(command: Callable) -> Callable:
    """Adds the subtitle layout options and --split-stereo to a command (for `parse_subtitles`)."""
    options = [
        click.option("--max-line-width", type=int, default=None, metavar="N",
                     help="srt/vtt: at most N characters in a line before it breaks (needs --word-timestamps; "
                          "an error without it, as in openai-whisper)."),
        click.option("--max-line-count", type=int, default=None, metavar="N",
                     help="srt/vtt: at most N lines in a cue; words then flow across segments (needs "
                          "--word-timestamps and --max-line-width)."),
        click.option("--max-words-per-line", type=int, default=None, metavar="N",
                     help="srt/vtt: at most N words in a cue (needs --word-timestamps; no effect with "
                          "--max-line-width)."),
        click.option("--highlight-words", is_flag=True,
                     help="srt/vtt: underline each word as it is spoken, <u>word</u> (needs --word-timestamps)."),
        click.option("--split-stereo", is_flag=True,
                     help="Transcribe the left and right channels apart (two-sided calls): -o DIR gets "
                          "<name>.left.<fmt> and <name>.right.<fmt>; on stdout each channel follows a line "
                          "'==> <name>.left <=='. Mono audio is an error."),
    ]

    for option in reversed(options):
        command = option(command)
    return command


def parse_subtitles(*, max_line_width: int | None, max_line_count: int | None, max_words_per_line: int | None,
                    highlight_words: bool, word_timestamps: bool) -> Any:
    """The `asr.writers.SubtitleOptions` of the layout options, or None when none is given; a note on stderr
    for each option that another one makes moot.

    Raises:
        ValueError: a width or count below 1, or a layout option without word timestamps.
    """
    from asr.writers import SubtitleOptions

    for name, value in (("max_line_width", max_line_width), ("max_line_count", max_line_count),
                        ("max_words_per_line", max_words_per_line)):
        if value is not None and value < 1:
            raise ValueError(f"{_flag(name)} must be a positive integer, got {value}")
    options = SubtitleOptions(max_line_width=max_line_width, max_line_count=max_line_count,
                              max_words_per_line=max_words_per_line, highlight_words=highlight_words)
    if not options.given:
        return None
    if not word_timestamps:
        raise ValueError(f"{_flag(options.given[0])} lays out cues by word times: add --word-timestamps")
    for note in options.ineffective():
        for name in _LAYOUT:
            note = note.replace(name, _flag(name))
        click.echo(f"warning: {note}", err=True)
    return options


@dataclass
class AudioInput:
    """One audio to transcribe: a path, or samples (standard input, one channel), and the name of its outputs."""

    source: Any  # a path, or float32 samples at 16 kHz
    name: str  # as shown in messages and progress
    path: str  # what `write_outputs` names the outputs after: the file, or STDIN_NAME
    suffix: str = ""  # after the name's stem: ".left", ".right"

    @property
    def stem(self) -> str:
        """The outputs' file name before the format: "talk", "talk.left", "stdin"."""
        return Path(self.path).stem + self.suffix


def audio_inputs(path: str, split_stereo: bool, stdin: Callable[[], bytes]) -> list[AudioInput]:
    """The audios to transcribe for one FILES argument: `-` reads `stdin()` (all of it), and with `split_stereo`
    the left and right channels come apart.

    Raises:
        audio.AudioError: unreadable audio, or audio that is not stereo with `split_stereo` (one line).
    """
    from audio import ChannelError, load_audio, load_audio_bytes

    from_stdin = path == "-"
    name = "<stdin>" if from_stdin else path
    output = STDIN_NAME if from_stdin else path
    data = stdin() if from_stdin else None
    if not split_stereo:
        if from_stdin:
            return [AudioInput(load_audio_bytes(data, name=name), name, output)]
        return [AudioInput(path, name, output)]
    def load(index: int):
        return load_audio_bytes(data, channel=index, name=name) if from_stdin else load_audio(path, channel=index)

    try:  # a channel no file has: the error tells how many this one has, before any samples are decoded
        load(_NO_SUCH_CHANNEL)
    except ChannelError as error:
        if error.channels != 2:  # mono, or 5.1 (whose speech is its centre channel, not left or right)
            kind = "mono" if error.channels == 1 else f"{error.channels}-channel"
            raise ChannelError(f"{name}: --split-stereo needs stereo audio, this is {kind}", error.channels) from None
    channels = [(side, load(index)) for index, side in reversed(STEREO_CHANNELS)]
    return [AudioInput(samples, f"{name} ({side})", output, f".{side}") for side, samples in reversed(channels)]


_NO_SUCH_CHANNEL = 2 ** 16


# Standard input is read whole before it is decoded (a pipe cannot seek): at most this much (18 hours of 16 kHz
# 16-bit mono WAV; a longer recording is better given by its path, which is read block by block).
STDIN_LIMIT = 2 * 2 ** 30
_PIECE = 2 ** 20


def read_stdin(stream=None, limit: int = STDIN_LIMIT) -> bytes:
    """Standard input's bytes, refused after its first MiB when they are no audio that can be read (without
    ffmpeg, which reads formats that cannot be told from their first bytes), and when they exceed `limit`.

    Raises:
        audio.AudioError: not audio, or more than `limit` bytes (one line).
    """
    import sys

    from audio import AudioError, check_audio_head

    stream = sys.stdin.buffer if stream is None else stream
    head = stream.read(_PIECE)
    check_audio_head(head)
    pieces, total = [head], len(head)
    while piece := stream.read(_PIECE):
        total += len(piece)
        if total > limit:
            raise AudioError(f"<stdin>: more than {limit / 2 ** 30:g} GiB of audio on standard input; give the "
                             "file's path instead (it is read block by block)")
        pieces.append(piece)
    return b"".join(pieces)


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def check_writable(folder: str) -> None:
    """Makes the output folder and writes a file in it, before any work: a folder that cannot be written fails
    the run at once, not after the first file's transcription.

    Raises:
        ValueError: the folder cannot be made or written (one line).
    """
    import tempfile

    try:
        Path(folder).mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".write-test-"):
            pass
    except OSError as error:
        raise ValueError(f"{folder}: cannot write the results there ({error.strerror or error})") from None


def detect_languages(bundle: WhisperBundle, files: tuple[str, ...], options: TranscribeOptions,
                     split_stereo: bool = False) -> int:
    """Prints `NAME: CODE PROBABILITY` per file (per channel with `split_stereo`; `-` is standard input);
    returns the exit status (1 when a file failed)."""
    from asr.whisper.language import detect_language
    from audio import load_audio, recording_floor

    failures = 0
    for path in files:
        try:
            for audio in audio_inputs(path, split_stereo, read_stdin):
                samples = load_audio(audio.source)
                # The recording's floor, as transcribing it would detect (asr.progress.AudioProgress.floor).
                language, probs = detect_language(bundle, samples, options.language_detection_segments,
                                                  options.language_detection_threshold,
                                                  recording_floor(samples, bundle.n_mels))
                click.echo(f"{audio.name}: {language} {probs[language]:.4f}")
        except ValueError as error:
            click.echo(f"error: {error}", err=True)
            failures += 1
    return 1 if failures else 0
