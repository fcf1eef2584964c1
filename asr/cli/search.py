"""The search options shared by `asr transcribe` and `asr batch`: beam search and best-of (openai-whisper's)."""

from __future__ import annotations

from typing import Any, Callable

import click

BEAM_HELP = ("Beam search with N beams at temperature 0 (openai-whisper's algorithm; its command line defaults to "
             "5, this one to greedy). The model decodes alone: an --assistant is refused, auto decodes without one.")


def search_options(command: Callable) -> Callable:
    """Adds --beam-size, --patience, --length-penalty and --best-of (openai-whisper's names and meanings)."""
    options = [
        click.option("--beam-size", type=int, default=None, metavar="N", help=BEAM_HELP),
        click.option("--patience", type=float, default=None,
                     help="Beam search stops once round(N * P) sequences have ended [default: 1.0]."),
        click.option("--length-penalty", type=float, default=None,
                     help="Rank candidates by log-probability / ((5 + length) / 6) ** L, L in [0, 1] "
                          "[default: / length]."),
        click.option("--best-of", type=int, default=None, metavar="N",
                     help="Samples per window at fallback temperatures above 0, the most likely kept (openai-whisper's "
                          "command line: 5) [default: 1]; with an --assistant each sample is assisted."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def search_settings(assistant: str, beam_size: int | None, patience: float | None, length_penalty: float | None,
                    best_of: int | None) -> tuple[dict[str, Any], str]:
    """The TranscribeOptions fields of the search options, and the --assistant to load.

    Beam search is plain decoding: `auto` then loads none (with a warning); any other assistant is refused.

    Raises:
        ValueError: beam search with an assistant.
    """
    fields = {"beam_size": beam_size, "patience": patience, "length_penalty": length_penalty, "best_of": best_of}
    if beam_size is not None and beam_size > 1:
        spec = assistant.strip()
        if spec == "auto":
            click.echo("warning: beam search decodes with the model alone; --assistant auto uses none", err=True)
            return fields, "none"
        if spec != "none":
            raise ValueError(f"--beam-size {beam_size} decodes with the model alone; drop --assistant {spec} "
                             "(or use --beam-size 1)")
    return fields, assistant
