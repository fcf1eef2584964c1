"""`asr distill`: parse, call `asr.distill.distill`, report. Importing this module imports only click."""

from __future__ import annotations

import json

import click

from asr.cli.runtime import DEVICES
from asr.errors import first_line


@click.command("distill")
@click.argument("model")
@click.option("--output", "-o", required=True, type=click.Path(file_okay=False),
              help="New folder for the draft (use it with --assistant FOLDER).")
@click.option("--audio", "audio_source", default=None,
              help="Your own recordings (folder, JSONL/CSV manifest or dataset), labelled by MODEL itself.")
@click.option("--tts", is_flag=True, help="Add speech synthesised here (espeak-ng, flite, festival).")
@click.option("--text", default=None, type=click.Path(dir_okay=False),
              help="Text for --tts, one sentence a line (default: the built-in corpus).")
@click.option("--tts-minutes", default=60.0, show_default=True, type=float, help="Minutes of speech to synthesise.")
@click.option("--language", default=None, help="Language of the --audio recordings (default: detect).")
@click.option("--augment", default=0, show_default=True, type=int,
              help="Altered takes of each --audio recording (speed, room, telephone band, noise), each labelled.")
@click.option("--layers", default=None, help="MODEL's decoder layers the draft starts from, e.g. 0,5 "
              "(default: the first and the last).")
@click.option("--vocabulary", default=None, type=int,
              help="Text tokens the draft may propose (default: all); fewer make each draft step cheaper.")
@click.option("--steps", default=3000, show_default=True, type=int, help="Training steps.")
@click.option("--max-minutes", default=None, type=float, help="Stop training after this many minutes.")
@click.option("--windows-per-step", default=4, show_default=True, type=int, help="30 s windows per training step.")
@click.option("--learning-rate", default=3e-4, show_default=True, type=float)
@click.option("--held-out", default=0.1, show_default=True, type=float,
              help="Share of recordings kept out of training to measure agreement.")
@click.option("--top-k", default=64, show_default=True, type=int, help="MODEL's logits kept per position.")
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--work-dir", default=None, type=click.Path(file_okay=False),
              help="Cache of audio, labels and checkpoints; a rerun resumes from it (default: OUTPUT.work).")
@click.option("--device", type=click.Choice(DEVICES), default="auto", show_default=True)
@click.option("--threads", type=int, default=None, help="Torch CPU threads.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bars.")
def distill_command(model, output, audio_source, tts, text, tts_minutes, language, augment, layers, vocabulary,
                    steps, max_minutes, windows_per_step, learning_rate, held_out, top_k, seed, work_dir, device,
                    threads, quiet) -> None:
    """Train a small draft that agrees with MODEL, to assist it (`--assistant OUTPUT`)."""
    from asr.cli.runtime import setup_runtime
    from asr.distill.pipeline import DistillOptions, TrainOptions, distill

    device, _ = setup_runtime(device, "float32", threads)
    try:
        options = DistillOptions(
            audio=audio_source, tts=tts, text=text, tts_minutes=tts_minutes, language=language, augment=augment,
            layers=_layers(layers), vocabulary=vocabulary, top_k=top_k, held_out=held_out, seed=seed,
            train=TrainOptions(steps=steps, max_minutes=max_minutes, windows_per_step=windows_per_step,
                               learning_rate=learning_rate, seed=seed),
        )
        report = distill(model, output, options, work_dir=work_dir, device=device, show_progress=not quiet)
    except ValueError as error:
        raise click.ClickException(first_line(error)) from None
    summary = {key: report[key] for key in ("agreement_before", "agreement", "agreement_full_vocabulary",
                                            "vocabulary", "steps", "minutes",
                                            "train_windows", "held_out_windows") if key in report}
    click.echo(json.dumps({"draft": output, **summary}))


def _layers(text: str | None) -> tuple[int, ...] | None:
    if text is None:
        return None
    from asr.options import split_numbers

    try:
        return split_numbers(text, int, "expected layer numbers separated by commas")
    except ValueError as error:
        raise click.BadParameter(str(error), param_hint="--layers") from None
