"""Reading and writing the run's files: atomic writes, free space, and the TSV tables.

Every file is written under a temporary name of its own writer (host and process in the name,
so two writers never share one) and renamed when complete: a file under its final name is whole.
"""

import csv
import ctypes
import errno
import json
import os
import re
import resource
import shutil
import socket
import sys
import tempfile
import traceback
from contextlib import contextmanager
from pathlib import Path

import numpy as np


class DiskFullError(OSError):
    """Not enough space for an output; the message names the path and the bytes it needs."""


class DamagedFileError(ValueError):
    """A file esmshard wrote that is no longer what it wrote: cut short, replaced by another
    program's file or a folder; the message names it and what to do, `problem` only what is
    wrong (for a file the user gave, where removing it is no advice)."""

    def __init__(self, message: str, problem: str | None = None):
        super().__init__(message)
        self.problem = problem or message


def is_object_url(path) -> bool:
    """Whether `path` names an object store location (s3://bucket/prefix) rather than a file
    or folder of this machine."""
    return "://" in str(path)


def given_path(text: str):
    """A command's path argument: an object store URL as it is (a Path would fold its `//`),
    anything else a Path."""
    return text if is_object_url(text) else Path(text)


def human_bytes(n: float) -> str:
    for unit in ("bytes", "KB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1000


def user_cache() -> Path:
    """This user's esmshard cache folder: under $XDG_CACHE_HOME where it is set (clusters point
    it at scratch space), else ~/.cache, as pip and torch's hub place theirs."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "esmshard"


def nearest_existing(path) -> Path:
    """`path` if it exists, else its nearest parent that does (where it would be made)."""
    path = Path(path).absolute()
    while not path.exists():
        path = path.parent
    return path


def free_bytes(path) -> int:
    """Free space on the filesystem that holds `path` (or would hold it, if it does not exist yet)."""
    return shutil.disk_usage(nearest_existing(path)).free


# The failed writes that mean "no room" (a full disk, a quota, a file size limit such as
# `ulimit -f`), with the words HDF5 reports them by (it wraps the errno in a later error).
NO_ROOM = {
    errno.ENOSPC: "No space left on device",
    errno.EDQUOT: "Disk quota exceeded",
    errno.EFBIG: "File too large",
}


def no_room_errno(err: BaseException) -> int | None:
    """The errno of NO_ROOM that `err`, or an error it arose from, is, if any."""
    while err is not None:
        code = getattr(err, "errno", None)
        if code in NO_ROOM:
            return code
        for known, words in NO_ROOM.items():
            if words in str(err):
                return known
        err = err.__cause__ or err.__context__
    return None


def file_size_limit() -> int | None:
    """The largest file this process may write (`ulimit -f`), None if unlimited."""
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    return None if limit == resource.RLIM_INFINITY else limit


def disk_full_error(path, needed: int | None, code: int = errno.ENOSPC) -> DiskFullError:
    """The one-line error of a write to `path` that found no room (`code`, of NO_ROOM)."""
    reason = f"[Errno {code}] {NO_ROOM[code]}"
    if code == errno.ENOSPC:
        need = f"about {human_bytes(needed)}" if needed else "more space"
        what = f"no space left for {path}: it needs {need} and {human_bytes(free_bytes(path))} "
        what += f"are free on that filesystem ({reason})"
        fix = "free some space there (or write to a larger disk)"
    elif code == errno.EDQUOT:
        what = f"no room for {path}: the disk quota is used up ({reason})"
        fix = "free some space or have the quota raised (or write elsewhere)"
    else:
        need = f"about {human_bytes(needed)}" if needed else "more"
        what = f"no room for {path}: it needs {need}, beyond this process's file size limit"
        limit = file_size_limit()
        what += f" of {human_bytes(limit)} ({reason})" if limit else f" ({reason})"
        fix = "raise the limit (`ulimit -f unlimited`)"
    err = DiskFullError(
        f"{what}. Nothing incomplete was kept; {fix} and run the same command again"
    )
    err.errno = code
    return err


def is_disk_full(err: BaseException) -> bool:
    """True if `err`, or an error it arose from, found no room (NO_ROOM)."""
    return no_room_errno(err) is not None


@contextmanager
def naming_disk_full(path, needed_bytes: int | None = None):
    """Writing `path` inside the block: with `needed_bytes`, refuse to start where its filesystem
    has less free; a disk that fills up meanwhile is reported as DiskFullError naming `path`."""
    if needed_bytes is not None and free_bytes(path) < needed_bytes:
        raise disk_full_error(path, needed_bytes)
    # Checked first, as free space is: HDF5 can crash its process after a write that failed.
    limit = file_size_limit()
    if needed_bytes is not None and limit is not None and needed_bytes > limit:
        raise disk_full_error(path, needed_bytes, errno.EFBIG)
    try:
        yield
    except Exception as err:
        if is_disk_full(err) and not isinstance(err, DiskFullError):
            raise disk_full_error(path, needed_bytes, no_room_errno(err)) from err
        raise


def quiet_hdf5_cleanup() -> None:
    """Silence h5py's reports of the objects it cannot free after a failed write (a full disk:
    dozens of tracebacks, through both of Python's hooks), so that the failure itself is seen,
    in one line; any other error is shown as before."""
    shown, shown_unraisable = sys.excepthook, sys.unraisablehook

    def in_h5py(tb) -> bool:
        return any("h5py" in frame.f_code.co_filename for frame, _ in traceback.walk_tb(tb))

    def excepthook(kind, error, tb):
        if not in_h5py(tb):
            shown(kind, error, tb)

    def unraisablehook(unraisable):
        if not in_h5py(unraisable.exc_traceback):
            shown_unraisable(unraisable)

    sys.excepthook, sys.unraisablehook = excepthook, unraisablehook


# What closing an HDF5 file written with no chunk cache (`rdcc_nbytes=0`: its values reach the
# disk as they are written, where a full disk raises an error) writes at most: its metadata.
CLOSE_BYTES = 4 << 20


def closable(h5, path) -> None:
    """Refuse (DiskFullError) to flush or close `h5`, open for writing at `path`, where its
    filesystem lacks the room to: HDF5 can crash its process when a flush finds the disk full."""
    if free_bytes(path) < CLOSE_BYTES:
        raise disk_full_error(path, CLOSE_BYTES)


# HDF5 files whose writing failed (a full disk), removed from the disk but never closed:
# closing such a file can crash HDF5 and end the process before its error is said. A job's
# process ends with os._exit, which closes nothing (esmshard.steps.job).
_ABANDONED = []


def abandon(h5, path) -> None:
    """Remove the file `path` that `h5`, whose writing failed, has open, and leave it unclosed."""
    Path(path).unlink(missing_ok=True)
    _ABANDONED.append(h5)


# Every temporary name esmshard writes ends `.esmshard-<host>-<pid>.tmp`: the clean-up of killed
# writers' leftovers (esmshard.store.leftovers) removes such names only, so a user's own
# `.draft.12345.tmp` beside the outputs is never taken for one.
TEMPORARY_NAME = re.compile(r"^\..+\.esmshard-(?P<host>.+)-(?P<pid>\d+)\.tmp$")


def writer_suffix() -> str:
    """The end of every temporary name this process writes: esmshard's mark, its host and
    process, so that a later run can tell a live writer's files from a dead one's."""
    return f".esmshard-{socket.gethostname()}-{os.getpid()}.tmp"


def remove_whole(folder) -> None:
    """Remove `folder` as one step: renamed to this process's temporary name first, so that a
    stop midway (Ctrl-C in a store of thousands of parts) leaves none of it under its name, only
    a dead writer's temporary, which the next run removes (esmshard.store.leftovers)."""
    folder = Path(folder)
    doomed = folder.with_name(f".{folder.name}{writer_suffix()}")
    os.replace(folder, doomed)
    shutil.rmtree(doomed)


def unwritable(path) -> str | None:
    """Why nothing can be written at `path` (a folder, or where one would be made), or None.

    A real probe, a file of esmshard's temporary name made and removed at once in `path` or
    its nearest existing parent: `os.access` says yes to root, even on a read-only mount.
    """
    folder = nearest_existing(path)
    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".probe-", suffix=writer_suffix()):
            pass
    except OSError as err:
        name = errno.errorcode.get(err.errno, "?")
        return f"{folder} cannot be written: {err.strerror or err} ({name})"
    return None


def temporary_folder(parent, purpose: str):
    """A folder for scratch files under `parent`, removed on exit (named as `writer_suffix`)."""
    return tempfile.TemporaryDirectory(dir=parent, prefix=f".{purpose}-", suffix=writer_suffix())


RENAME_NOREPLACE = 1  # renameat2's flag (Linux): fail where the target exists


def put_new(source: Path, path: Path) -> None:
    """Rename `source` (a file or a folder) to `path`, which must not exist: FileExistsError
    where something appeared there meanwhile, which is left as it is."""
    renameat2 = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    if renameat2 is not None:
        at_cwd = -100  # AT_FDCWD: the paths as given
        if renameat2(at_cwd, os.fsencode(source), at_cwd, os.fsencode(path),
                     RENAME_NOREPLACE) == 0:  # fmt: skip
            return
        code = ctypes.get_errno()
        if code not in (errno.EINVAL, errno.ENOSYS):  # else: a filesystem without the flag
            raise OSError(code, os.strerror(code), str(path))
    if not source.is_dir():  # where the flag is not had, a file's link fails on a taken name
        try:
            os.link(source, path)
            os.unlink(source)
            return
        except FileExistsError:
            raise
        except OSError:  # a filesystem without links either
            pass
    if os.path.lexists(path):  # then checked, and renamed
        raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(path))
    os.rename(source, path)


@contextmanager
def atomic_path(path, needed_bytes: int | None = None, replace: bool = True):
    """Yield a temporary path beside `path` (for a file, or a folder the block makes); rename it
    to `path` if the block succeeds, else remove it. `replace=False`: never over something that
    appeared at `path` meanwhile (FileExistsError, the temporary removed).

    A full disk is reported as in `naming_disk_full`, once the temporary file is gone (so that
    the free space reported is true).
    """
    path = Path(path)
    with naming_disk_full(path, needed_bytes):
        tmp = path.with_name(f".{path.name}{writer_suffix()}")
        try:
            yield tmp
            if not replace:
                put_new(tmp, path)
                return
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

    def add_file(self, path) -> None:
        """One more file, numbered after the others."""
        self.paths.append(path)
        self.buffers.append([])

    def add(self, bucket: int, data: bytes) -> None:
        self.buffers[bucket].append(data)
        self.size += len(data)
        if self.size >= self.limit_bytes:
            self.flush()

    def scatter(self, buckets: np.ndarray, entries: np.ndarray) -> None:
        """Each of `entries` to the file its number in `buckets` names, in their order."""
        order = np.argsort(buckets, kind="stable")
        bounds = np.searchsorted(buckets[order], np.arange(len(self.paths) + 1))
        for b in np.flatnonzero(np.diff(bounds)):
            self.add(int(b), entries[order[bounds[b] : bounds[b + 1]]].tobytes())

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


def write_parquet(path, columns: dict[str, str], rows, metadata: dict) -> None:
    """A Parquet file of `rows`, its `columns` by name and pyarrow type name ("string",
    "int32", "float32"), `metadata` (as text) in its schema; whole or not at all."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    values = list(zip(*rows)) if rows else [[] for _ in columns]
    table = pa.table(
        [pa.array(v, type=getattr(pa, kind)()) for v, kind in zip(values, columns.values())],
        names=list(columns),
    ).replace_schema_metadata({k: str(v) for k, v in metadata.items()})
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp)


def read_tsv(path) -> list[dict]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh, delimiter="\t"))
