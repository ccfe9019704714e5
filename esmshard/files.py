"""Reading and writing the run's files: atomic writes, free space, and the TSV tables.

Every file is written under a temporary name of its own writer (host and process in the name,
so two writers never share one) and renamed when complete: a file under its final name is whole.
"""

import csv
import errno
import json
import os
import re
import shutil
import socket
import tempfile
from contextlib import contextmanager
from pathlib import Path


class DiskFullError(OSError):
    """Not enough space for an output; the message names the path and the bytes it needs."""


def human_bytes(n: float) -> str:
    for unit in ("bytes", "KB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1000


def free_bytes(path) -> int:
    """Free space on the filesystem that holds `path` (or would hold it, if it does not exist yet)."""
    path = Path(path).absolute()
    while not path.exists():
        path = path.parent
    return shutil.disk_usage(path).free


def disk_full_error(path, needed: int | None) -> DiskFullError:
    need = f"about {human_bytes(needed)}" if needed else "more space"
    err = DiskFullError(
        f"no space left for {path}: it needs {need} and {human_bytes(free_bytes(path))} are free "
        "on that filesystem. Nothing incomplete was kept; free some space (or set `outdir` to a "
        "larger disk) and run the same command again"
    )
    err.errno = errno.ENOSPC
    return err


def is_disk_full(err: BaseException) -> bool:
    """True if `err`, or an error it arose from, is ENOSPC (HDF5 reports it as a later error)."""
    while err is not None:
        if getattr(err, "errno", None) == errno.ENOSPC or "No space left on device" in str(err):
            return True
        err = err.__cause__ or err.__context__
    return False


@contextmanager
def naming_disk_full(path, needed_bytes: int | None = None):
    """Writing `path` inside the block: with `needed_bytes`, refuse to start where its filesystem
    has less free; a disk that fills up meanwhile is reported as DiskFullError naming `path`."""
    if needed_bytes is not None and free_bytes(path) < needed_bytes:
        raise disk_full_error(path, needed_bytes)
    try:
        yield
    except Exception as err:
        if is_disk_full(err) and not isinstance(err, DiskFullError):
            raise disk_full_error(path, needed_bytes) from err
        raise


# Every temporary name esmshard writes ends `.esmshard-<host>-<pid>.tmp`: the clean-up of killed
# writers' leftovers (esmshard.store.leftovers) removes such names only, so a user's own
# `.draft.12345.tmp` beside the outputs is never taken for one.
TEMPORARY_NAME = re.compile(r"^\..+\.esmshard-(?P<host>.+)-(?P<pid>\d+)\.tmp$")


def writer_suffix() -> str:
    """The end of every temporary name this process writes: esmshard's mark, its host and
    process, so that a later run can tell a live writer's files from a dead one's."""
    return f".esmshard-{socket.gethostname()}-{os.getpid()}.tmp"


def temporary_folder(parent, purpose: str):
    """A folder for scratch files under `parent`, removed on exit (named as `writer_suffix`)."""
    return tempfile.TemporaryDirectory(dir=parent, prefix=f".{purpose}-", suffix=writer_suffix())


@contextmanager
def atomic_path(path, needed_bytes: int | None = None):
    """Yield a temporary path beside `path` (for a file, or a folder the block makes); rename it
    to `path` if the block succeeds, else remove it.

    A full disk is reported as in `naming_disk_full`, once the temporary file is gone (so that
    the free space reported is true).
    """
    path = Path(path)
    with naming_disk_full(path, needed_bytes):
        tmp = path.with_name(f".{path.name}{writer_suffix()}")
        try:
            yield tmp
            if tmp.is_dir() and path.is_dir():
                shutil.rmtree(path)  # a folder is renamed over an empty one only
            os.replace(tmp, path)
        finally:
            if tmp.is_dir():
                shutil.rmtree(tmp, ignore_errors=True)
            else:
                tmp.unlink(missing_ok=True)


class Buckets:
    """Appends to many files with bounded memory: what is added is kept per file and written
    out, every file at once, when the buffers together pass `limit_bytes` (no open-file limit
    applies, as each file is open only while written)."""

    def __init__(self, paths, limit_bytes: int = 64 << 20):
        self.paths = list(paths)
        self.buffers = [[] for _ in self.paths]
        self.size = 0
        self.limit_bytes = limit_bytes

    def add(self, bucket: int, data: bytes) -> None:
        self.buffers[bucket].append(data)
        self.size += len(data)
        if self.size >= self.limit_bytes:
            self.flush()

    def flush(self) -> None:
        for path, buffer in zip(self.paths, self.buffers):
            if buffer:
                with open(path, "ab") as fh:
                    fh.write(b"".join(buffer))
                buffer.clear()
        self.size = 0


def write_text(path, text: str) -> None:
    with atomic_path(path) as tmp:
        Path(tmp).write_text(text)


def write_json(path, data: dict) -> None:
    write_text(path, json.dumps(data, indent=2) + "\n")


def write_tsv(path, columns, rows) -> None:
    with atomic_path(path) as tmp, open(tmp, "w", newline="") as fh:
        writer = csv.writer(fh, delimiter="\t", lineterminator="\n")
        writer.writerow(columns)
        writer.writerows(rows)


def read_tsv(path) -> list[dict]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh, delimiter="\t"))
