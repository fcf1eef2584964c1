"""The `asr` command line: the layer above the library (`asr`) and the evaluation tooling (`eval`).

One module per command; each imports only click at import time, so `asr --help` answers at once.
"""

import click

from asr.cli.batch import batch_command
from asr.cli.distill import distill_command
from asr.cli.eval import eval_command
from asr.cli.generate import generate
from asr.cli.models import models
from asr.cli.serve import serve_command
from asr.cli.stream import listen_command, stream_command
from asr.cli.transcribe import transcribe


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """Whisper transcription sped up by assisted decoding, with the large model's exact words."""


for _command in (transcribe, stream_command, listen_command, serve_command, batch_command, eval_command, distill_command,
                 generate, models):
    main.add_command(_command)

__all__ = ["main"]
