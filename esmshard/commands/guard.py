"""The process between `esmshard run` and its Snakemake: it ends the workflow when the command
ends, however the command ends.

    python -m esmshard.commands.guard SNAKEMAKE-COMMAND...

It leads a process group of its own, holding Snakemake and, through it, the local jobs. A
SIGTERM, SIGINT or SIGHUP that reaches it (from `esmshard run`, once; or from the kernel when
`esmshard run` ends, `kill -9` and a dropped SSH session included: PR_SET_PDEATHSIG) goes to the
whole group once, as SIGTERM for SIGHUP: the jobs keep what they finished and stop, and
Snakemake (which on SIGTERM alone would wait for its running jobs) ends with them. A group
still alive `GRACE_SECONDS` later (Snakemake writing to a terminal that is gone) is killed, so
that the same command can run at once. Its exit status is Snakemake's.
"""

import ctypes
import os
import signal
import subprocess
import sys
import time

PR_SET_PDEATHSIG = 1  # linux/prctl.h
GRACE_SECONDS = 10  # a job keeps what it finished in a second or two
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
PARENT_ENV = "ESMSHARD_GUARD_PARENT"  # the process whose end ends the workflow


def end_with_parent(parent: int) -> None:
    """Have the kernel send this process SIGTERM when `parent` ends (Linux; elsewhere not)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # it ended before the request was in place
        os.kill(os.getpid(), signal.SIGTERM)


def main(argv: list[str]) -> int:
    stopped = []

    def forward(signum, frame):
        for each in FORWARDED:  # once: what comes after, the group's own copy too, is dropped
            signal.signal(each, signal.SIG_IGN)
        stopped.append(time.monotonic())
        os.killpg(0, signal.SIGTERM if signum == signal.SIGHUP else signum)

    for signum in FORWARDED:
        signal.signal(signum, forward)
    end_with_parent(int(os.environ.pop(PARENT_ENV, os.getppid())))
    snakemake = subprocess.Popen(argv)
    while True:
        try:
            status = snakemake.wait(timeout=1)
            return status if status >= 0 else 128 - status  # killed by a signal: as a shell says
        except subprocess.TimeoutExpired:
            if stopped and time.monotonic() - stopped[0] > GRACE_SECONDS:
                os.killpg(0, signal.SIGKILL)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
