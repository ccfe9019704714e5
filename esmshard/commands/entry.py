"""The `esmshard` console script's entry point: a Ctrl-C while the command's modules still
import (a second or more on a busy machine) ends it quietly, as one during its work does."""

import sys


def main():
    try:
        from .cli import main as command
    except KeyboardInterrupt:
        sys.exit(130)  # the shell's code for a command stopped by SIGINT
    return command()
