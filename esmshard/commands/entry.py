"""The `esmshard` console script's entry point: a Ctrl-C while the command's modules still
import or its options are read (a second or more on a busy machine), or one that a command
does not end in a line of its own, ends it quietly with the shell's status; one once it has
finished changes nothing."""

import signal
import sys


def main():
    try:
        from .cli import main as command

        return command()
    except KeyboardInterrupt:
        sys.exit(130)  # the shell's code for a command stopped by SIGINT
    finally:
        # The command is done: a Ctrl-C as Python then exits (a finished `status --watch`)
        # would only print tracebacks from its exit handlers, and die of the signal.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
