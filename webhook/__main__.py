"""``python -m webhook``: the same command line as ``admit-guard``."""

from .cli import main

main(prog_name="admit-guard")
