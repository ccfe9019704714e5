"""Runs and store maintenance side by side: a run holds a shared lock on the store key it reads
and writes, for its whole life; `esmshard store --remove` and `--prune` take it exclusively,
and refuse, naming the runs, while any run holds it.

The lock is an `flock` on `<store>/.locks/<key>.lock` (outside the key's folder, which removal
deletes). Each run also holds `<store>/.locks/<key>.<host>.<pid>.json`, which says who it is: a
refusal names the runs whose file is locked; a file no process holds is a dead run's, and goes.
Like the outdir's run lock, these die with their process.
"""

import fcntl
import json
import os
import socket
from contextlib import ExitStack, contextmanager
from pathlib import Path

from .runlock import describe, this_process

_held = []  # this process's open lock files: each lock lasts as long as its file is open


class StoreBusyError(RuntimeError):
    """A run holds the store key that maintenance would change."""


class LocksPlaceError(ValueError):
    """Something not a folder lies where the store keeps its lock files."""


LOCKS = ".locks"  # the store's folder of lock files


def _folder(store_root) -> Path:
    return Path(store_root) / LOCKS


def locks_problem(store_root) -> str | None:
    """Why the store's lock files cannot be kept in their folder, if they cannot."""
    folder = _folder(store_root)
    if os.path.lexists(folder) and not folder.is_dir():
        return (
            f"{folder} is a file, where esmshard keeps the store's lock files: move it away "
            "(esmshard made no such file)"
        )
    return None


def _made_folder(store_root) -> Path:
    problem = locks_problem(store_root)
    if problem:
        raise LocksPlaceError(problem)
    folder = _folder(store_root)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def hold_shared(store_root, key: str) -> None:
    """Hold the store key shared for the life of this process (a run), saying who holds it."""
    _held.extend(_take_shared(store_root, key, this_process()))


@contextmanager
def shared(store_root, key: str, command: str):
    """Hold the store key shared for the block (an `esmshard.embed` call: `command` says which),
    as a run holds it for its life."""
    record, lock = _take_shared(store_root, key, {**this_process(), "command": command})
    try:
        yield
    finally:
        lock.close()
        Path(record.name).unlink(missing_ok=True)
        record.close()


def _take_shared(store_root, key: str, who: dict):
    folder = _made_folder(store_root)
    holders(store_root, key)  # removes the records of runs that have ended
    record = open(folder / f"{key}.{socket.gethostname()}.{os.getpid()}.json", "w")
    fcntl.flock(record, fcntl.LOCK_EX)
    record.write(json.dumps(who))
    record.flush()
    lock = open(folder / f"{key}.lock", "a")
    fcntl.flock(lock, fcntl.LOCK_SH)  # waits while maintenance of the key (seconds) finishes
    return record, lock


def holders(store_root, key: str) -> list[dict]:
    """The runs that hold `key` now; the records of dead ones are removed on the way."""
    found = []
    for path in sorted(_folder(store_root).glob(f"{key}.*.json")):
        try:
            fh = open(path)
        except FileNotFoundError:
            continue
        with fh:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                try:
                    found.append(json.loads(fh.read()))
                except ValueError:
                    found.append({})  # it is writing its record this moment
                continue
            path.unlink(missing_ok=True)
    return found


@contextmanager
def exclusive(store_root, keys, doing: str):
    """Hold every key of `keys` exclusively for the block, or raise StoreBusyError naming the
    runs using one: maintenance takes them all before it reads what it would change, so that
    nothing a live run (or `esmshard.embed` call) writes, its kept pieces included, is listed,
    set aside or removed."""
    folder = _made_folder(store_root)
    with ExitStack() as stack:
        for key in sorted(set(keys)):
            lock = stack.enter_context(open(folder / f"{key}.lock", "a"))
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                runs = "; ".join(describe(h) for h in holders(store_root, key)) or "another run"
                raise StoreBusyError(
                    f"cannot {doing} settings {key} of {store_root}: in use by {runs}. Run it "
                    "again once that run has finished (or stop the run); nothing was changed"
                ) from None
        yield
