"""One run at a time in an outdir: a lock held by the Snakemake process for the whole run.

A second run in the same outdir would start the same jobs, and Snakemake would delete outputs
that the first run is writing or has finished. The lock is an `flock` on `.esmshard/run.lock`,
which dies with its process: a run killed with -9 (or whose node was lost, once the filesystem's
lock lease expires) never blocks the next one, so resuming stays the same command, no flag. The
file holds who took the lock, which the refusal names.
"""

import datetime
import fcntl
import json
import logging
import os
import secrets
import socket
import sys
import time
from pathlib import Path

log = logging.getLogger(__name__)

# A job on another host whose progress file has not changed for this long is taken for dead
# (on its own host, a job is dead when its process is gone).
STALE_AFTER_SECONDS = 30 * 60

_held = []  # the open lock file of this process's run: the lock lasts as long as it is open


class RunActiveError(RuntimeError):
    """Another run holds the outdir."""


def _holder(fh) -> dict:
    for _ in range(20):  # the holder may be writing its record this moment
        fh.seek(0)
        try:
            return json.loads(fh.read())
        except ValueError:
            time.sleep(0.05)
    return {}


def describe(holder: dict) -> str:
    if not holder:
        return "another run (it has not said which yet)"
    started = datetime.datetime.fromtimestamp(holder["started_at"]).isoformat(
        sep=" ", timespec="seconds"
    )
    return (
        f"the run of process {holder['pid']} on host {holder['host']}, started {started} "
        f"in {holder['workdir']}: {holder['command']}"
    )


def active_run(holder: dict, lock_path, outdir) -> str:
    """Why a run cannot start in `outdir`, whose lock `holder` holds."""
    return (
        f"another esmshard run is active in {outdir}: {describe(holder)}. Two runs in one "
        "outdir would redo and delete each other's work: wait for that run to finish (or stop "
        f"it), or give this one another outdir. ({lock_path} holds the lock; a run that died "
        "releases it by itself.)"
    )


def active_run_problem(lock_path, outdir, say=log.info) -> str | None:
    """`active_run`'s line where a run holds the outdir's lock now, before this run tries to
    take it; else None. A run whose `esmshard run` is gone is ending: waited for, which `say`
    tells the user."""
    if not run_active(lock_path):
        return None
    with open(lock_path) as fh:
        holder = _holder(fh)
    if ending(holder) and released(lock_path, say):
        return None
    return active_run(holder, lock_path, outdir)


def ending(holder: dict) -> bool:
    """Whether the run holding a lock is ending: the `esmshard run` that started it, on this
    host, is gone (killed with -9, its terminal closed), and its guard stops the workflow within
    ENDING_SECONDS (esmshard.commands.guard)."""
    launcher = holder.get("launcher_pid")
    return (
        isinstance(launcher, int)
        and holder.get("host") == socket.gethostname()
        and not process_alive(launcher)
    )


def released(lock_path, say, fh=None) -> bool:
    """Whether the outdir's lock is released within ENDING_SECONDS (and taken on `fh`, where
    given); the wait is said once, by `say`."""
    say("esmshard: the run stopped in this outdir is still ending; waiting for it to end")
    deadline = time.monotonic() + ENDING_SECONDS
    while time.monotonic() < deadline:
        if (not run_active(lock_path)) if fh is None else taken(fh):
            return True
        time.sleep(0.1)
    return False


def taken(fh) -> bool:
    """Whether the lock on the open lock file `fh` is taken now, without waiting."""
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def hold(lock_path, outdir, say=log.info) -> None:
    """Take the outdir's run lock for the life of this process, or raise RunActiveError (a run
    that is ending is waited for, as active_run_problem does)."""
    lock_path = Path(lock_path)
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    fh = open(lock_path, "a+")
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _holder(fh)
        if not (ending(holder) and released(lock_path, say, fh)):
            fh.close()
            raise RunActiveError(active_run(holder, lock_path, outdir)) from None
    except OSError as err:  # a filesystem without file locks (e.g. Lustre mounted without flock)
        log.warning(
            "cannot lock %s (%s): this filesystem has no file locks, so a second run started in "
            "%s would not be stopped",
            lock_path,
            err,
            outdir,
        )
    fh.seek(0)
    fh.truncate()
    fh.write(json.dumps(new_run()))
    fh.flush()
    _held.append(fh)


def run_active(lock_path) -> bool:
    """Whether a run holds the outdir's lock now (without taking it)."""
    try:
        with open(lock_path, "a+") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            fcntl.flock(fh, fcntl.LOCK_UN)
    except BlockingIOError:
        return True
    except OSError:  # no lock file (no run yet), or a filesystem without locks
        return False
    return False


# What `esmshard run` sets for the Snakemake it starts: the command as the user typed it, and
# its own process (a run whose command is gone is ending: `ending`).
TYPED_COMMAND_ENV = "ESMSHARD_TYPED_COMMAND"
LAUNCHER_ENV = "ESMSHARD_RUN_PID"
# How long a run whose `esmshard run` is gone may take to end: its guard's grace, and a margin.
ENDING_SECONDS = 15


def this_process() -> dict:
    """Who holds a lock, as `describe` names it."""
    return {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "started_at": time.time(),
        "workdir": os.getcwd(),
        "command": " ".join(sys.argv),
        # the command the user typed, where `esmshard run` started this Snakemake
        "typed_command": os.environ.get(TYPED_COMMAND_ENV),
        "launcher_pid": int(os.environ[LAUNCHER_ENV]) if LAUNCHER_ENV in os.environ else None,
    }


def new_run() -> dict:
    """The record of a run starting in this process: a new run id, and who it is."""
    return {"run_id": secrets.token_hex(8), **this_process()}


def current_run(lock_path) -> dict:
    """The run that holds (or last held) the outdir's lock, as `this_process` and `hold` record
    it ({} where unknown): merge records its command and start."""
    try:
        holder = json.loads(Path(lock_path).read_text())
    except (OSError, ValueError):
        return {}
    return holder if isinstance(holder, dict) else {}


def current_run_id(lock_path) -> str | None:
    """The id of the run that holds (or last held) the outdir's lock: embed jobs record it, so
    that merge can tell what this command computed from what an earlier one did."""
    return current_run(lock_path).get("run_id")


def process_alive(pid: int) -> bool:
    """Whether process `pid` of this host still runs (a zombie, dead but not yet reaped, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # no /proc (macOS): os.kill's answer stands
    return stat[stat.rindex(")") + 2] not in "ZX"
