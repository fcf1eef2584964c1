"""`asr stream` and `asr listen`: live transcription of a file, a pipe of raw PCM, or a microphone. Committed
text goes to standard output as soon as two hypotheses agree on it; the whole transcript can be written at the
end (Ctrl-C ends a stream too: what was heard is committed and written)."""

from __future__ import annotations

import json
import sys
import time
from typing import Callable, Iterator

import click

from asr.cli.options import describe_assistant, optional_float
from asr.cli.runtime import parse_offload, runtime_options, setup_runtime
from asr.cli.transcribe import status_lines
from asr.cli.transcribe_io import check_writable
from asr.constants import TASKS

STREAM_FORMATS = ("txt", "jsonl", "srt", "vtt", "json")


def _live_options(command: Callable) -> Callable:
    """What both commands take, in this order on their help pages."""
    options = [
        click.option("--model", default="base", show_default=True, help="Model name, hub id or folder."),
        click.option("--assistant", default="auto", show_default=True,
                     help="Drafts each re-decode: the last hypothesis first, then this assistant for the new audio "
                          "(auto: the shipped draft where it pays); none re-decodes without drafting."),
        click.option("--language", default=None, help="Spoken language (default: detected on the first update)."),
        click.option("--task", type=click.Choice(TASKS), default="transcribe", show_default=True),
        click.option("--initial-prompt", default=None, help="Text before the stream (names, spelling)."),
        click.option("--step", type=float, default=1.0, show_default=True,
                     help="Seconds of new audio between updates (the least; more when decoding falls behind)."),
        click.option("--trim-seconds", type=float, default=15.0, show_default=True,
                     help="A buffer longer than this is cut at its last committed segment."),
        click.option("--compression-ratio-threshold", default="2.4", show_default=True, callback=optional_float,
                     metavar="FLOAT|none",
                     help="A decoded window whose gzip compression ratio is above this is a loop: its words are "
                          "not committed (a stream has no temperature fallback); none: keep every window."),
        click.option("--vad", is_flag=True,
                     help="Silero VAD: silence is not decoded (nothing invented, less compute), and a pause of "
                          "0.5 s commits the words before it."),
        click.option("--output-format", "-f", type=click.Choice(STREAM_FORMATS), default="txt", show_default=True,
                     help="txt: committed text on standard output as it comes; jsonl: a JSON line per commit "
                          "(start, end, text, emitted_at) and one of stats; with -o, the transcript's file format."),
        click.option("--output-dir", "-o", default=None, type=click.Path(file_okay=False),
                     help="Write the whole transcript here when the stream ends."),
        runtime_options(threads_help="Torch CPU threads."),
        click.option("--quiet", "-q", is_flag=True, help="No status lines."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


@click.command("stream")
@click.argument("source", type=click.Path(dir_okay=False, allow_dash=True))
@click.option("--realtime", is_flag=True,
              help="Feed a file at the pace of its audio (the clock decides when audio arrives; latency is "
                   "measured so). Without it, updates come every --step of audio as fast as they decode.")
@click.option("--input-rate", type=int, default=16000, show_default=True,
              help="Sample rate of raw PCM on standard input (SOURCE -: signed 16-bit little-endian mono).")
@_live_options
def stream_command(source, realtime, input_rate, **common) -> None:
    """Transcribe SOURCE live: an audio file, or - for raw 16 kHz mono s16le PCM on standard input (what
    `arecord -f S16_LE -r 16000 -c 1 -t raw` or `ffmpeg -i IN -f s16le -ar 16000 -ac 1 -` writes)."""
    from asr.live.sources import file_chunks, pcm_chunks

    def chunks(step: float) -> Iterator:
        if source == "-":
            if not 1000 <= input_rate <= 768000:
                raise ValueError(f"--input-rate must be from 1000 to 768000 Hz, got {input_rate}")
            return pcm_chunks(sys.stdin.buffer, step, input_rate)
        from audio import load_audio

        return file_chunks(load_audio(source), step, realtime)

    _run(chunks, "stdin" if source == "-" else source, wall_clock=realtime, **common)


@click.command("listen")
@click.option("--input-device", default=None, help="Microphone: a PortAudio device name or number (default: the "
                                                   "system's; `python -m sounddevice` lists them).")
@_live_options
def listen_command(input_device, **common) -> None:
    """Transcribe the microphone live (needs the `live` extra: sounddevice and PortAudio); Ctrl-C ends."""
    from asr.live.sources import microphone_chunks

    device = int(input_device) if input_device is not None and input_device.isdigit() else input_device
    _run(lambda step: microphone_chunks(step, device), "microphone", wall_clock=True, **common)


def _run(chunks: Callable[[float], Iterator], name: str, *, wall_clock: bool, model, assistant, language, task,
         initial_prompt, step, trim_seconds, compression_ratio_threshold, vad, output_format, output_dir, device,
         dtype, offload, offload_folder, max_memory, threads, quiet) -> None:
    from asr.assist.choose import load_pair
    from asr.live import StreamingTranscriber
    from asr.options import TranscribeOptions

    with status_lines(quiet) as status:
        device, precision = setup_runtime(device, dtype, threads)
        offloading = parse_offload(offload, offload_folder, max_memory)
        try:
            if not 0.1 <= step <= 10:
                raise ValueError(f"--step must be from 0.1 to 10 seconds, got {step:g}")
            if output_format in ("srt", "vtt", "json") and output_dir is None:
                raise ValueError(f"-f {output_format} writes the transcript when the stream ends: give -o DIR")
            if output_dir is not None:
                check_writable(output_dir)
            source = chunks(step)  # a file is read (and checked) before the model loads
            options = TranscribeOptions(language=language, task=task, initial_prompt=initial_prompt,
                                        compression_ratio_threshold=compression_ratio_threshold)
            status(f"loading {model} on {device} ({str(precision).removeprefix('torch.')})")
            bundle, chosen = load_pair(model, assistant, device=device, dtype=precision, offload=offloading)
            began = time.monotonic()
            clock = (lambda: time.monotonic() - began) if wall_clock else None
            voice = None
            if vad:
                from asr.live.voice import VoiceActivity

                voice = VoiceActivity()
            live = StreamingTranscriber(bundle, options, chosen, drafting=assistant != "none",
                                        trim_seconds=trim_seconds, clock=clock, voice=voice)
            # What drafts: on a CPU a stream leaves out the draft `auto` chose for files (asr.live.transcriber).
            status(describe_assistant(assistant, live.assistant)
                   + ("; drafting from the last hypothesis" if assistant != "none" else ""))
        except ValueError as error:
            raise click.ClickException(str(error)) from None
        show, failed = _printer(output_format), False
        try:
            for chunk in source:
                live.insert_audio(chunk)
                for segment in live.process():
                    show(segment)
        except KeyboardInterrupt:
            status("stopped: committing what was heard")
        except ValueError as error:  # a microphone that went away: what was heard is still committed
            click.echo(f"error: {error}", err=True)
            failed = True
        for segment in live.finish():
            show(segment)
        if output_format == "jsonl":
            click.echo(json.dumps({"stats": live.stats.to_dict()}))
        if output_dir is not None:
            from pathlib import Path

            from asr.writers import write_outputs

            fmt = "json" if output_format == "jsonl" else output_format
            for path in write_outputs(live.transcript(), name, output_dir, (fmt,), stem=Path(name).stem):
                status(f"wrote {path}")
        if failed:
            sys.exit(1)


def _printer(output_format: str) -> Callable:
    def show(segment) -> None:
        if output_format == "jsonl":
            click.echo(json.dumps(segment.to_dict(), ensure_ascii=False))
        else:
            click.echo(segment.text.strip())
        sys.stdout.flush()
    return show
