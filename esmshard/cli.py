"""The `esmshard` console script."""

import argparse
import sys
import time
from pathlib import Path

from .status import read_state, render


def main(argv=None):
    parser = argparse.ArgumentParser(prog="esmshard", description="esmshard run tools")
    commands = parser.add_subparsers(dest="command", required=True)
    status = commands.add_parser(
        "status", help="dashboard of a run: per device slot, progress, ETA"
    )
    status.add_argument("outdir", type=Path, help="the run's outdir (as in the config)")
    status.add_argument(
        "--watch",
        nargs="?",
        const=5.0,
        type=float,
        metavar="SECONDS",
        help="refresh every SECONDS (default 5) until interrupted",
    )
    args = parser.parse_args(argv)
    while True:
        text = render(read_state(args.outdir))
        if not args.watch:
            print(text)
            return 0
        sys.stdout.write("\033[H\033[J" + text + "\n")
        sys.stdout.flush()
        try:
            time.sleep(args.watch)
        except KeyboardInterrupt:
            return 0
