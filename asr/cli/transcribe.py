"""`asr transcribe`: parse, load the model and its assistant, transcribe each file, write the results."""

from __future__ import annotations

import sys

import click

from asr.cli.decode_options import (
    check_for_model_cli,
    decoding_options,
    detect_languages_cli,
    take_decoding,
)
from asr.cli.runtime import parse_offload, runtime_options, setup_runtime
from asr.cli.search import search_options, search_settings
from asr.cli.transcribe_io import STDIN_NAME, check_writable, subtitle_options
from asr.constants import OUTPUT_FORMATS, TASKS
from decoding.schedule import SCHEDULES

# Files longer than this (one window) get a progress bar.
PROGRESS_MIN_SECONDS = 30.0


@click.command("transcribe")
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=True))
@click.option("--model", default="base", show_default=True, help="Model name (see `asr models`), hub id or folder.")
@click.option("--assistant", default="none", show_default=True,
              help="none, auto, self:bf16, self:int8, a model name, hub id or folder.")
@click.option("--language", default=None, help="Spoken language code or name (default: detect).")
@click.option("--task", type=click.Choice(TASKS), default="transcribe", show_default=True)
@click.option("--output-format", "-f", default="txt", show_default=True,
              type=click.Choice([*OUTPUT_FORMATS, "all"]))
@click.option("--output-dir", "-o", default=None, type=click.Path(file_okay=False),
              help="Write DIR/<name>.<format>; without it the chosen format goes to stdout (txt: the text).")
@click.option("--timestamps/--without-timestamps", default=None,
              help="Timestamp tokens: segments at the model's own times (default: on; off with --batch-size, one segment per chunk).")
@click.option("--word-timestamps", is_flag=True, help="Add word-level times (alignment heads and DTW).")
@click.option("--initial-prompt", default=None, help="Text that comes before the first window.")
@click.option("--temperature", "temperatures", default="0,0.2,0.4,0.6,0.8,1.0", show_default=True,
              help="Temperatures tried in turn when a window fails the fallback checks.")
@click.option("--no-condition-on-previous-text", is_flag=True, help="Decode each window without the previous text.")
@search_options
@click.option("--schedule", type=click.Choice(SCHEDULES), default=None,
              help="How many tokens the assistant drafts per round [default: heuristic; a distilled draft "
                   "constant (1 with this project's native kernels, else 3); constant 10 when auto drafts for an "
                   "offloaded model].")
@click.option("--num-assistant-tokens", default=None, type=int,
              help="Drafts per round (start) [default: 5; see --schedule].")
@runtime_options(threads_help="Torch CPU threads.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
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
@decoding_options
@click.option("--clip-timestamps", default="", metavar="START,END,...",
              help="Transcribe only these clips (seconds; an odd count runs to the end).")
@click.option("--carry-initial-prompt", is_flag=True,
              help="Put the initial prompt before every window's previous text, not only the first window's.")
@click.option("--prefix", default=None, help="Text the first window's transcript starts with.")
@click.option("--verbose", "-v", is_flag=True, help="Print each segment as it is decoded (no progress bar).")
@click.option("--detect-language", is_flag=True, help="Only print each file's detected language and its probability.")
@subtitle_options
def transcribe(files, model, assistant, language, task, output_format, output_dir, timestamps,
               word_timestamps, initial_prompt, temperatures, no_condition_on_previous_text, beam_size, patience,
               length_penalty, best_of, schedule, num_assistant_tokens, device, dtype, offload, offload_folder,
               max_memory, threads, quiet, batch_size,
               vad, vad_threshold, vad_min_speech_ms, vad_min_silence_ms, vad_speech_pad_ms, vad_max_speech_s,
               subtitle_layout, split_stereo, **more) -> None:
    """Transcribe (or translate) audio FILES of any length.

    A FILE of - reads the audio (any format a file may have) from standard input; -o DIR then writes
    DIR/stdin.<format>.
    """
    from asr.assist.choose import load_pair
    from asr.cli.transcribe_io import audio_inputs, parse_subtitles
    from asr.options import TranscribeOptions
    from asr.writers import output_formats, output_stems, write_format, write_outputs

    device, torch_dtype = setup_runtime(device, dtype, threads)
    offloading = parse_offload(offload, offload_folder, max_memory)
    try:
        vad_options = vad_from_cli(vad, batch_size is not None, threshold=vad_threshold,
                                   min_speech_duration_ms=vad_min_speech_ms,
                                   min_silence_duration_ms=vad_min_silence_ms, speech_pad_ms=vad_speech_pad_ms,
                                   max_speech_duration_s=vad_max_speech_s)
        search, assistant = search_settings(assistant, beam_size, patience, length_penalty, best_of)
        options = TranscribeOptions(
            language=language, task=task, timestamps=timestamps, word_timestamps=word_timestamps,
            initial_prompt=initial_prompt, temperatures=_floats(temperatures, "--temperature"),
            condition_on_previous_text=not no_condition_on_previous_text, schedule=schedule,
            num_assistant_tokens=num_assistant_tokens, vad=vad_options, batch_size=batch_size, **search,
            **take_decoding(more), clip_timestamps=more["clip_timestamps"], prefix=more["prefix"],
            carry_initial_prompt=more["carry_initial_prompt"],
        )
        formats = output_formats(output_format)
        subtitles = parse_subtitles(subtitle_layout, word_timestamps)
        if files.count("-") > 1:
            raise ValueError("standard input (-) can be read once: give - once")
        if output_dir is None and len(formats) > 1:
            raise ValueError("-f all writes one file per format: give an output folder with -o DIR")
        if output_dir is not None:
            check_writable(output_dir)
        if more["detect_language"]:
            assistant = "none"
        bundle, helper = load_pair(model, assistant, device=device, dtype=torch_dtype, offload=offloading,
                                   batched=batch_size is not None)
        check_for_model_cli(options, bundle, more["detect_language"])
    except ValueError as error:
        raise click.ClickException(str(error)) from None
    if more["detect_language"]:
        sys.exit(detect_languages_cli(bundle, files, options, split_stereo))
    failures = 0
    stems = output_stems([STDIN_NAME if path == "-" else path for path in files])
    for path, stem in zip(files, stems):
        try:
            audios = audio_inputs(path, split_stereo, lambda: sys.stdin.buffer.read())
            transcripts = [(audio, transcribe_file(bundle, audio.source, options, helper, show_progress=not quiet,
                                                   name=audio.name, verbose=more["verbose"]))
                           for audio in audios]
        except ValueError as error:  # AudioError and option errors: one line, then the next file
            click.echo(f"error: {error}", err=True)
            failures += 1
            continue
        for audio, transcript in transcripts:
            if output_dir is not None:
                try:
                    write_outputs(transcript, audio.path, output_dir, formats, subtitles, audio.suffix,
                                  stem=stem)
                except OSError as error:  # a full disk, a folder made read-only meanwhile: say so, go on
                    click.echo(f"error: {audio.name}: cannot write its results to {output_dir} ({error.strerror or error})",
                               err=True)
                    failures += 1
                continue
            if split_stereo:
                click.echo(f"==> {audio.stem} <==")
            if output_format == "txt":
                click.echo(transcript.text.strip())
            else:  # srt, vtt, tsv or json on stdout, as the file would hold it
                write_format(output_format, transcript, sys.stdout, subtitles)
    if failures:
        click.echo(f"{failures} of {len(files)} file(s) failed", err=True)
        sys.exit(1)


def transcribe_file(bundle, path, options, assistant=None, show_progress: bool = True, name: str | None = None,
                    verbose: bool = False):
    """Transcribes one file (or samples, then called `name`), with a progress bar on stderr for audio longer than a
    window, or with `verbose` each segment on stdout as it is decoded (openai-whisper's `[00:00.000 --> 00:04.000]  text`)."""
    from asr.live import transcribe_segments
    from asr.writers import format_timestamp

    bar = None

    def progress(done: float, total: float) -> None:
        nonlocal bar
        if bar is None and total > PROGRESS_MIN_SECONDS:
            from tqdm import tqdm

            bar = tqdm(total=round(total, 1), unit="s", desc=str(name or path), file=sys.stderr, leave=False)
        if bar is not None:
            bar.update(round(done, 1) - bar.n)

    try:
        transcription = transcribe_segments(bundle, path, options, assistant,
                                            progress if show_progress and not verbose else None)
        told = False
        for segment in transcription:
            if verbose and not told and transcription.language_probs is not None:
                from transformers.models.whisper.tokenization_whisper import LANGUAGES

                # openai-whisper's line when the language was detected.
                click.echo(f"Detected language: {LANGUAGES.get(transcription.language, transcription.language).title()}")
            told = True
            if verbose:
                click.echo(f"[{format_timestamp(segment.start)} --> {format_timestamp(segment.end)}] {segment.text}")
        return transcription.result()
    finally:
        if bar is not None:
            bar.close()


def vad_from_cli(flag: bool, batched: bool, **given):
    """VAD options from `--vad` and the `--vad-*` values given (None: not given); None when VAD is off.

    The defaults are faster-whisper's: those of `vad_filter` for the sequential mode, those of its batched
    pipeline (`asr.options.BATCHED_VAD`) with `--batch-size`.

    Raises:
        ValueError: a value out of range.
    """
    from dataclasses import replace

    from asr.options import BATCHED_VAD
    from audio.vad import VadOptions

    given = {name: value for name, value in given.items() if value is not None}
    if not (flag or given):
        return None
    return replace(BATCHED_VAD if batched else VadOptions(), **given)


def _floats(text: str, option: str) -> tuple[float, ...]:
    from asr.options import split_numbers

    try:
        return split_numbers(text, float, "expected numbers separated by commas")
    except ValueError as error:
        raise click.BadParameter(str(error), param_hint=option) from None
