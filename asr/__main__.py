"""`python -m asr` runs the command line (also under `accelerate launch -m asr`)."""

from asr.cli import main

main()
