"""`asr transcribe`: parse and check the options, load the model and its assistant, transcribe each file, write
the results; status lines on stderr unless `-q`."""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import click

from asr.cli.options import (
    assistant_to_load,
    describe_assistant,
    note_moot_options,
    parse_clips_option,
    parse_temperatures_option,
    transcription_options,
)
from asr.cli.runtime import parse_offload, runtime_options, setup_runtime
from asr.cli.transcribe_io import STDIN_NAME, check_writable, subtitle_options
from asr.constants import OUTPUT_FORMATS, TEMPERATURES
from audio.constants import CHUNK_LENGTH
from decoding.schedule import SCHEDULES

if TYPE_CHECKING:
    from asr.results import Transcript
    from asr.transcription import Transcriber
    from asr.writers import SubtitleOptions

# Files longer than one window get a progress bar.
PROGRESS_MIN_SECONDS = float(CHUNK_LENGTH)


@click.command("transcribe")
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=True))
@transcription_options
@click.option("--output-format", "-f", default="txt", show_default=True,
              type=click.Choice([*OUTPUT_FORMATS, "all"]))
@click.option("--output-dir", "-o", default=None, type=click.Path(file_okay=False),
              help="Write DIR/<name>.<format>; without it the chosen format goes to stdout (txt: the text).")
@click.option("--initial-prompt", default=None, help="Text that comes before the first window.")
@click.option("--temperature", "temperatures", default=",".join(f"{t:g}" for t in TEMPERATURES), show_default=True,
              callback=parse_temperatures_option,
              help="Temperatures tried in turn when a window fails the fallback checks.")
@click.option("--no-condition-on-previous-text", is_flag=True, help="Decode each window without the previous text.")
@click.option("--schedule", type=click.Choice(SCHEDULES), default=None,
              help="How many tokens the assistant drafts per round [default: heuristic; a draft model "
                   "constant, its k chosen from the measured step costs; constant 10 when auto drafts for an "
                   "offloaded model].")
@click.option("--num-assistant-tokens", default=None, type=int,
              help="Drafts per round (start) [default: 5; see --schedule].")
@runtime_options(threads_help="Torch CPU threads.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar and no status lines.")
@click.option("--batch-size", type=int, default=None,
              help="Cut the speech into chunks of up to 30 s at pauses (VAD implied) and decode N chunks at a "
                   "time; several times faster on long files, words may differ from the sequential mode.")
@click.option("--vad", is_flag=True, help="Decode only the speech that Silero VAD finds (any --vad-* implies it).")
@click.option("--vad-threshold", type=float, default=None, help="Speech probability threshold [default: 0.5].")
@click.option("--vad-min-speech-ms", type=int, default=None, help="Drop shorter speech [default: 0].")
@click.option("--vad-min-silence-ms", type=int, default=None,
              help="Shorter pauses do not end speech [default: 2000; 160 with --batch-size].")
@click.option("--vad-speech-pad-ms", type=int, default=None, help="Padding on both sides of speech [default: 400].")
@click.option("--vad-max-speech-s", type=float, default=None,
              help="Cut longer speech at its longest pause [default: none; 30 with --batch-size].")
@click.option("--clip-timestamps", default="", metavar="START,END,...", callback=parse_clips_option,
              help="Transcribe only these clips (seconds; an odd count runs to the end).")
@click.option("--carry-initial-prompt", is_flag=True,
              help="Put the initial prompt before every window's previous text, not only the first window's.")
@click.option("--prefix", default=None, help="Text the first window's transcript starts with.")
@click.option("--verbose", "-v", is_flag=True, help="Print each segment as it is decoded (no progress bar).")
@click.option("--detect-language", is_flag=True, help="Only print each file's detected language and its probability.")
@subtitle_options
def transcribe(files, model, assistant, make_options, output_format, output_dir, initial_prompt, temperatures,
               no_condition_on_previous_text, schedule, num_assistant_tokens, device, dtype, offload, offload_folder,
               max_memory, threads, quiet, batch_size, vad, vad_threshold, vad_min_speech_ms, vad_min_silence_ms,
               vad_speech_pad_ms, vad_max_speech_s, clip_timestamps, carry_initial_prompt, prefix, verbose,
               detect_language, max_line_width, max_line_count, max_words_per_line, highlight_words,
               split_stereo) -> None:
    """Transcribe (or translate) audio FILES of any length.

    A FILE of - reads the audio (any format a file may have) from standard input; -o DIR then writes
    DIR/stdin.<format>.
    """
    from asr.assist.choose import load_pair
    from asr.cli.transcribe_io import detect_languages, parse_subtitles
    from asr.transcription import Transcriber
    from asr.writers import output_formats

    with status_lines(quiet) as status:
        device, precision = setup_runtime(device, dtype, threads)
        offloading = parse_offload(offload, offload_folder, max_memory)
        try:
            # 1. Everything that can be checked without a model, once, before any model is loaded.
            vad_options = vad_from_cli(vad, batch_size is not None, threshold=vad_threshold,
                                       min_speech_duration_ms=vad_min_speech_ms,
                                       min_silence_duration_ms=vad_min_silence_ms, speech_pad_ms=vad_speech_pad_ms,
                                       max_speech_duration_s=vad_max_speech_s)
            options = make_options(
                batch_size=batch_size, initial_prompt=initial_prompt, temperatures=temperatures,
                condition_on_previous_text=not no_condition_on_previous_text, schedule=schedule,
                num_assistant_tokens=num_assistant_tokens, vad=vad_options, clip_timestamps=clip_timestamps,
                carry_initial_prompt=carry_initial_prompt, prefix=prefix)
            assistant = "none" if detect_language else assistant_to_load(assistant, options)
            formats = output_formats(output_format)
            subtitles = parse_subtitles(max_line_width=max_line_width, max_line_count=max_line_count,
                                        max_words_per_line=max_words_per_line, highlight_words=highlight_words,
                                        word_timestamps=options.word_timestamps)
            if files.count("-") > 1:
                raise ValueError("standard input (-) can be read once: give - once")
            if output_dir is None and len(formats) > 1:
                raise ValueError("-f all writes one file per format: give an output folder with -o DIR")
            if output_dir is not None:
                check_writable(output_dir)
            # 2. The model and its assistant, and the checks that need them, once for all the files.
            status(f"loading {model} on {device} ({str(precision).removeprefix('torch.')})")
            bundle, chosen = load_pair(model, assistant, device=device, dtype=precision, offload=offloading,
                                       batched=batch_size is not None)
            note_moot_options(options, bundle, detect_language)
            if detect_language:
                sys.exit(detect_languages(bundle, files, options, split_stereo))
            status(describe_assistant(assistant, chosen))
            transcriber = Transcriber(bundle, options, chosen)
        except ValueError as error:
            raise click.ClickException(str(error)) from None
        # 3. Each file in turn: a file that fails is reported in one line and the others go on.
        failures = _transcribe_files(transcriber, files, output_dir, formats, output_format, subtitles, split_stereo,
                                     show_progress=not quiet, verbose=verbose, status=status)
        if failures:
            click.echo(f"{failures} of {len(files)} file(s) failed", err=True)
            sys.exit(1)


def _transcribe_files(transcriber: Transcriber, files: tuple[str, ...], output_dir: str | None, formats: list[str],
                      output_format: str, subtitles: SubtitleOptions | None, split_stereo: bool, show_progress: bool,
                      verbose: bool, status: Callable[[str], None]) -> int:
    """Transcribes and writes each file; returns how many failed."""
    from asr.cli.transcribe_io import audio_inputs, read_stdin
    from asr.writers import output_stems, write_format, write_outputs

    failures = 0
    stems = output_stems([STDIN_NAME if path == "-" else path for path in files])
    for path, stem in zip(files, stems):
        try:
            audios = audio_inputs(path, split_stereo, read_stdin)
            transcripts = [(audio, transcribe_file(transcriber, audio.source, show_progress, audio.name, verbose))
                           for audio in audios]
        except ValueError as error:  # AudioError and option errors: one line, then the next file
            click.echo(f"error: {error}", err=True)
            failures += 1
            continue
        for audio, transcript in transcripts:
            if output_dir is not None:
                try:
                    written = write_outputs(transcript, audio.path, output_dir, formats, subtitles, audio.suffix,
                                            stem=stem)
                except OSError as error:  # a full disk, a folder made read-only meanwhile: say so, go on
                    click.echo(f"error: {audio.name}: cannot write its results to {output_dir} "
                               f"({error.strerror or error})", err=True)
                    failures += 1
                    continue
                for written_path in written:
                    status(f"wrote {written_path}")
                continue
            if split_stereo:
                click.echo(f"==> {audio.stem} <==")
            elif len(files) > 1:
                click.echo(f"==> {audio.name} <==")
            if output_format != "txt":  # srt, vtt, tsv or json on stdout, as the file would hold it
                write_format(output_format, transcript, sys.stdout, subtitles)
            elif not verbose:  # verbose printed the segments already
                click.echo(transcript.text.strip())
    return failures


def transcribe_file(transcriber: Transcriber, source, show_progress: bool = True, name: str | None = None,
                    verbose: bool = False) -> Transcript:
    """Transcribes one file (or samples, then called `name`), with a progress bar on stderr for audio longer than a
    window, or with `verbose` each segment on stdout as it is decoded (openai-whisper's `[00:00.000 --> 00:04.000]  text`)."""
    from asr.writers import format_timestamp

    bar = None

    def progress(done: float, total: float) -> None:
        nonlocal bar
        if bar is None and total > PROGRESS_MIN_SECONDS:
            from tqdm import tqdm

            bar = tqdm(total=round(total, 1), unit="s", desc=str(name or source), file=sys.stderr, leave=False)
        if bar is not None:
            bar.update(round(done, 1) - bar.n)

    try:
        transcription = transcriber.segments(source, progress if show_progress and not verbose else None)
        first = True
        for segment in transcription:
            if verbose and first and transcription.language_probs is not None:
                from transformers.models.whisper.tokenization_whisper import LANGUAGES

                # openai-whisper's line when the language was detected.
                click.echo(f"Detected language: {LANGUAGES.get(transcription.language, transcription.language).title()}")
            first = False
            if verbose:
                click.echo(f"[{format_timestamp(segment.start)} --> {format_timestamp(segment.end)}] {segment.text}")
        return transcription.result()
    finally:
        if bar is not None:
            bar.close()


class _WarningLines(logging.Handler):
    """The library's warnings (a window that failed every fallback temperature, say) as `warning: ...` lines on
    stderr, as it is when they happen."""

    def emit(self, record: logging.LogRecord) -> None:
        click.echo(f"{record.levelname.lower()}: {record.getMessage()}", err=True)


@contextlib.contextmanager
def status_lines(quiet: bool) -> Iterator[Callable[[str], None]]:
    """The function that prints a status line on stderr, for the command's run; with `quiet` it, and the
    library's warnings, print nothing."""
    logger = logging.getLogger("asr")
    handler = _WarningLines(logging.CRITICAL + 1 if quiet else logging.WARNING)
    logger.addHandler(handler)

    def status(line: str) -> None:
        if not quiet:
            click.echo(line, err=True)
    try:
        yield status
    finally:
        logger.removeHandler(handler)


def vad_from_cli(flag: bool, batched: bool, **given):
    """VAD options from `--vad` and the `--vad-*` values given (None: not given); None when VAD is off.

    The defaults are faster-whisper's: those of `vad_filter` for the sequential mode, those of its batched
    pipeline (`asr.options.BATCHED_VAD`) with `--batch-size`.
    """
    from dataclasses import replace

    from asr.options import BATCHED_VAD
    from audio.vad import VadOptions

    given = {name: value for name, value in given.items() if value is not None}
    if not (flag or given):
        return None
    return replace(BATCHED_VAD if batched else VadOptions(), **given)
