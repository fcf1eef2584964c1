"""The options `asr transcribe` and `asr batch` share, and `build_options`, which turns the values of these and of
`asr transcribe`'s own options into `TranscribeOptions`: the model and its assistant, what to produce (language,
task, timestamps), openai-whisper's search (beam search, best-of), and openai-whisper's and faster-whisper's
further decoding options (their names in kebab-case). Text forms are parsed here, by click callbacks; what can be
checked without a model is checked once, before any model is loaded."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, Callable

import click

from asr.constants import TASKS, TEMPERATURES

if TYPE_CHECKING:
    from asr.models.registry import WhisperBundle
    from asr.options import TranscribeOptions
    from audio.vad import VadOptions

BEAM_HELP = ("Beam search with N beams at temperature 0 (openai-whisper's algorithm; its command line defaults to "
             "5, this one to greedy). The model decodes alone: an --assistant is refused, auto decodes without one.")


def optional_float(ctx: click.Context, param: click.Parameter, value: str | None) -> float | None:
    """A number, or None for "none" (openai-whisper's optional_float)."""
    if value is None or value.strip().lower() == "none":
        return None
    try:
        return float(value)
    except ValueError:
        raise click.BadParameter(f"expected a number or none, got {value!r}") from None


def _numbers(parse: Callable[[str], tuple]) -> Callable[[click.Context, click.Parameter, str], tuple]:
    """A click callback that parses comma-separated numbers with `parse` (an `asr.options` parser)."""
    def callback(ctx: click.Context, param: click.Parameter, value: str) -> tuple:
        try:
            return parse(value)
        except ValueError as error:
            raise click.BadParameter(str(error), param_hint=param.opts[0]) from None
    return callback


def _suppress_tokens(ctx: click.Context, param: click.Parameter, value: str) -> tuple[int, ...]:
    from asr.options import parse_suppress_tokens

    return _numbers(parse_suppress_tokens)(ctx, param, value)


def parse_clips_option(ctx: click.Context, param: click.Parameter, value: str) -> tuple[float, ...]:
    """`--clip-timestamps START,END,...` as seconds."""
    from asr.options import parse_clip_timestamps

    return _numbers(parse_clip_timestamps)(ctx, param, value)


def parse_temperatures_option(ctx: click.Context, param: click.Parameter, value: str) -> tuple[float, ...]:
    """`--temperature 0,0.2,...` as numbers."""
    from asr.options import split_numbers

    return _numbers(lambda text: split_numbers(text, float, "expected numbers separated by commas"))(ctx, param, value)


SHARED = [
    click.option("--model", default="base", show_default=True, help="Model name (see `asr models`), hub id or folder."),
    click.option("--assistant", default="auto", show_default=True,
                 help="auto (a draft where it pays: the words are the model's either way), none, self:bf16, "
                      "self:int8, a draft, model name, hub id or folder."),
    click.option("--language", default=None, help="Spoken language code or name (default: detect, per file)."),
    click.option("--task", type=click.Choice(TASKS), default="transcribe", show_default=True),
    click.option("--timestamps/--without-timestamps", default=None,
                 help="Timestamp tokens: segments at the model's own times (default: on; off when speech chunks "
                      "are batched, one segment per chunk)."),
    click.option("--word-timestamps", is_flag=True, help="Add word-level times (alignment heads and DTW)."),
    click.option("--beam-size", type=int, default=None, metavar="N", help=BEAM_HELP),
    click.option("--patience", type=float, default=None,
                 help="Beam search stops once round(N * P) sequences have ended [default: 1.0]."),
    click.option("--length-penalty", type=float, default=None,
                 help="Rank candidates by log-probability / ((5 + length) / 6) ** L, L in [0, 1] [default: / length]."),
    click.option("--best-of", type=int, default=None, metavar="N",
                 help="Samples per window at fallback temperatures above 0, the most likely kept (openai-whisper's "
                      "command line: 5) [default: 1]; with an --assistant each sample is assisted."),
    click.option("--compression-ratio-threshold", default="2.4", show_default=True, callback=optional_float,
                 metavar="FLOAT|none",
                 help="Decode a window again (next temperature) when its gzip compression ratio is above this; none: never."),
    click.option("--logprob-threshold", default="-1.0", show_default=True, callback=optional_float, metavar="FLOAT|none",
                 help="Decode a window again when its average log-probability is below this; none: never."),
    click.option("--no-speech-threshold", default="0.6", show_default=True, callback=optional_float, metavar="FLOAT|none",
                 help="A window whose no-speech probability is above this (and log-probability below "
                      "--logprob-threshold) is silence; none: never."),
    click.option("--suppress-tokens", default="-1", show_default=True, metavar="IDS", callback=_suppress_tokens,
                 help="Token ids never generated, comma-separated; -1: the model's non-speech list."),
    click.option("--hotwords", default=None,
                 help="Words put in the prompt of every window (faster-whisper's hotwords; not in the --prefix window)."),
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


# The shared options the command itself reads; the others reach it only through `make_options`.
READ_BY_COMMAND = ("model", "assistant")


def transcription_options(command: Callable) -> Callable:
    """Adds the options `asr transcribe` and `asr batch` share to a command. It receives `model` and `assistant`
    as they are, and `make_options`: `build_options` with the shared values given, to be called with the
    command's own options (one `TranscribeOptions`, built and checked once)."""
    @functools.wraps(command)
    def run(**values: Any) -> Any:
        shared = {name: values.pop(name) for name in _SHARED_NAMES if name not in READ_BY_COMMAND}
        return command(make_options=functools.partial(build_options, **shared), **values)

    for option in reversed(SHARED):
        run = option(run)
    return run


def _parameter_names(options: list[Callable]) -> tuple[str, ...]:
    """The names of the parameters some click option decorators declare (decorating a stand-in collects them)."""
    def stand_in() -> None:
        pass

    for option in options:
        stand_in = option(stand_in)
    return tuple(parameter.name for parameter in stand_in.__click_params__)


_SHARED_NAMES = _parameter_names(SHARED)


def build_options(*, language: str | None, task: str, timestamps: bool | None, word_timestamps: bool,
                  beam_size: int | None, patience: float | None, length_penalty: float | None, best_of: int | None,
                  compression_ratio_threshold: float | None, logprob_threshold: float | None,
                  no_speech_threshold: float | None, suppress_tokens: tuple[int, ...], hotwords: str | None,
                  hallucination_silence_threshold: float | None, language_detection_segments: int,
                  language_detection_threshold: float, multilingual: bool, batch_size: int | None = None,
                  initial_prompt: str | None = None, temperatures: tuple[float, ...] = TEMPERATURES,
                  condition_on_previous_text: bool = True, schedule: str | None = None,
                  num_assistant_tokens: int | None = None, vad: VadOptions | None = None,
                  clip_timestamps: tuple[float, ...] = (), carry_initial_prompt: bool = False,
                  prefix: str | None = None) -> TranscribeOptions:
    """The `TranscribeOptions` of the command line's values, checked as far as they can be without a model (the
    language against Whisper's languages).

    Raises:
        ValueError: a value out of range, an unknown language, or options that do not go together.
    """
    from asr.options import TranscribeOptions
    from asr.whisper.language import language_code

    if language is not None:
        language_code(language)
    return TranscribeOptions(
        language=language, task=task, timestamps=timestamps, word_timestamps=word_timestamps,
        initial_prompt=initial_prompt, condition_on_previous_text=condition_on_previous_text,
        temperatures=temperatures, compression_ratio_threshold=compression_ratio_threshold,
        logprob_threshold=logprob_threshold, no_speech_threshold=no_speech_threshold, beam_size=beam_size,
        patience=patience, length_penalty=length_penalty, best_of=best_of, schedule=schedule,
        num_assistant_tokens=num_assistant_tokens, vad=vad, batch_size=batch_size, suppress_tokens=suppress_tokens,
        clip_timestamps=clip_timestamps, hallucination_silence_threshold=hallucination_silence_threshold,
        carry_initial_prompt=carry_initial_prompt, prefix=prefix, hotwords=hotwords,
        language_detection_segments=language_detection_segments,
        language_detection_threshold=language_detection_threshold, multilingual=multilingual)


def assistant_to_load(assistant: str, options: TranscribeOptions) -> str:
    """The --assistant to load: beam search is plain decoding, so `auto` then loads none and any other assistant
    is refused.

    Raises:
        ValueError: beam search with an assistant.
    """
    if not options.beam_search:
        return assistant
    spec = assistant.strip()
    if spec == "auto":
        return "none"
    if spec != "none":
        raise ValueError(f"--beam-size {options.beam_size} decodes with the model alone; drop --assistant {spec} "
                         "(or use --beam-size 1)")
    return assistant


def note_moot_options(options: TranscribeOptions, bundle: WhisperBundle, detect_only: bool = False) -> None:
    """Errors for options the model cannot honour, before any file; a note for detection options that do nothing.

    Raises:
        ValueError: multilingual detection or `--detect-language` with an English-only model.
    """
    detection = options.language_detection_segments != 1 or options.language_detection_threshold != 0.5
    if not bundle.is_multilingual:
        if detect_only:
            raise ValueError(f"model {bundle.name} is English-only; it has no languages to detect")
        if detection:
            click.echo("note: English-only model: the language detection options do nothing", err=True)
    elif options.language is not None and detection:
        click.echo("note: --language given: the language detection options do nothing", err=True)


def describe_assistant(spec: str, assistant: Any) -> str:
    """The status line naming the assistant a run decodes with."""
    name = getattr(assistant, "name", None) or "none"
    return f"assistant: {name}" + (" (chosen by --assistant auto)" if spec.strip() == "auto" else "")
