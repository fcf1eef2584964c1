"""Decoding options shared by `asr transcribe` and `asr batch`: openai-whisper's fallback thresholds and
suppress list, faster-whisper's hotwords and language detection (their names in kebab-case); the checks of
these options against the loaded model, and `asr transcribe --detect-language`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click


def _optional_float(ctx: click.Context, param: click.Parameter, value: str | None) -> float | None:
    """A number, or None for "none" (openai-whisper's optional_float)."""
    if value is None or value.strip().lower() == "none":
        return None
    try:
        return float(value)
    except ValueError:
        raise click.BadParameter(f"expected a number or none, got {value!r}") from None


SHARED = [
    click.option("--compression-ratio-threshold", default="2.4", show_default=True, callback=_optional_float, metavar="FLOAT|none",
                 help="Decode a window again (next temperature) when its gzip compression ratio is above this; none: never."),
    click.option("--logprob-threshold", default="-1.0", show_default=True, callback=_optional_float, metavar="FLOAT|none",
                 help="Decode a window again when its average log-probability is below this; none: never."),
    click.option("--no-speech-threshold", default="0.6", show_default=True, callback=_optional_float, metavar="FLOAT|none",
                 help="A window whose no-speech probability is above this (and log-probability below "
                      "--logprob-threshold) is silence; none: never."),
    click.option("--suppress-tokens", default="-1", show_default=True, metavar="IDS",
                 help="Token ids never generated, comma-separated; -1: the model's non-speech list."),
    click.option("--hotwords", default=None, help="Words put in the prompt of every window (faster-whisper's hotwords; not in the --prefix window)."),
    click.option("--hallucination-silence-threshold", default=None, type=float,
                 help="With --word-timestamps: skip silent periods longer than this many seconds around a "
                      "likely hallucination."),
    click.option("--language-detection-segments", default=1, show_default=True, type=int,
                 help="Detect the language over the first N 30 s windows (probabilities averaged)."),
    click.option("--language-detection-threshold", default=0.5, show_default=True, type=float,
                 help="With several detection windows: stop at the first whose language is more likely than this."),
    click.option("--multilingual", is_flag=True,
                 help="Detect the language of every window (each segment's `language` in the JSON)."),
]
NAMES = ("compression_ratio_threshold", "logprob_threshold", "no_speech_threshold", "suppress_tokens", "hotwords",
         "hallucination_silence_threshold", "language_detection_segments", "language_detection_threshold",
         "multilingual")


def decoding_options(command: Callable) -> Callable:
    """Adds the shared decoding options to a command; `take_decoding` gets their values back."""
    for option in reversed(SHARED):
        command = option(command)
    return command


def take_decoding(values: dict[str, Any]) -> dict[str, Any]:
    """Removes the shared options from a command's keyword arguments; returns them as TranscribeOptions fields."""
    return {name: values.pop(name) for name in NAMES}


def check_for_model_cli(options, bundle, detect_only: bool) -> None:
    """Errors for options the model cannot honour, before any file; a note for detection options that do nothing."""
    from asr.options import check_for_model

    check_for_model(options, bundle)
    detection = options.language_detection_segments != 1 or options.language_detection_threshold != 0.5
    if not bundle.is_multilingual:
        if detect_only:
            raise ValueError(f"model {bundle.name} is English-only; it has no languages to detect")
        if detection:
            click.echo("note: English-only model: the language detection options do nothing", err=True)
    elif options.language is not None and detection:
        click.echo("note: --language given: the language detection options do nothing", err=True)


def detect_languages_cli(bundle, files, options, split_stereo: bool = False) -> int:
    """Prints `NAME: CODE PROBABILITY` per file (per channel with `split_stereo`; `-` is standard input);
    returns the exit status (1 when a file failed)."""
    import sys

    from asr.cli.transcribe_io import audio_inputs
    from asr.whisper.language import detect_language
    from audio import load_audio, recording_floor

    failures = 0
    for path in files:
        try:
            for audio in audio_inputs(path, split_stereo, lambda: sys.stdin.buffer.read()):
                samples = load_audio(audio.source)
                # The recording's floor, as transcribing it would detect (asr.items._Item.floor).
                language, probs = detect_language(bundle, samples, options.language_detection_segments,
                                                  options.language_detection_threshold,
                                                  recording_floor(samples, bundle.n_mels))
                click.echo(f"{audio.name}: {language} {probs[language]:.4f}")
        except ValueError as error:
            click.echo(f"error: {error}", err=True)
            failures += 1
    return 1 if failures else 0
