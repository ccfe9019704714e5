"""The `esmshard` console script."""

import argparse
import sys
import time
from pathlib import Path

from .status import read_state, render


def seconds(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text}: give a number of seconds greater than 0")
    return value


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
        type=seconds,
        metavar="SECONDS",
        help="refresh every SECONDS (default 5) until interrupted",
    )
    args = parser.parse_args(argv)
    if not args.outdir.is_dir():
        what = "is a file" if args.outdir.exists() else "does not exist"
        parser.error(f"{args.outdir} {what}; give the `outdir` folder of a run")
    while True:
        state = read_state(args.outdir)
        text = render(state)
        if not args.watch:
            print(text)
            return 0 if state["planned"] or state["started"] else 1
        sys.stdout.write("\033[H\033[J" + text + "\n")
        sys.stdout.flush()
        try:
            time.sleep(args.watch)
        except KeyboardInterrupt:
            return 0
