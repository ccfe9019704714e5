"""The shard step's first pass: every record read, checked and spooled, by several processes.

The inputs are cut into pieces: each compressed file whole, each large plain file into byte
ranges that start at a header (esmshard.input.fasta.FilePart; threads count the lines before
each first, so that every record keeps its file's line number). A worker process
(`python -m esmshard.input.scan`) scans each piece into a folder of its own: the spooled
sequence lines, its rows of the record table, and each record's length, ID hash and SHA-256
digest, with the problems it found. The pieces are read back in input order, so the result is the
same whatever the number of workers; the step's own process keeps 12 bytes per record.
"""

import ctypes
import hashlib
import json
import os
import signal
import subprocess
import sys
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from itertools import islice
from pathlib import Path
from typing import Iterator, NamedTuple

import numpy as np

from ..embeddings_h5.id_index import id_hashes
from .fasta import (
    FIX_RECORD,
    FastaError,
    FilePart,
    compression,
    count_newlines,
    header_offsets,
    looks_nucleotide,
    printable,
    read_raw,
)
from .input_problems import InputProblems
from .records import ScanWriter, source

# A plain file is cut into byte ranges of at least this size, about two per worker.
PIECE_BYTES = 64 << 20
RECORDS_AT_ONCE = 1 << 16
PR_SET_PDEATHSIG = 1
# What each piece's folder holds.
SEQUENCES, TABLE, DIGESTS, LENGTHS, HASHES, FOUND = (
    "sequences",
    "records.parquet",
    "sha256",
    "lengths",
    "id_hashes",
    "found.json",
)


@dataclass
class LongRecords:
    """The records longer than truncation_seq_length: how many, and the longest of them."""

    count: int = 0
    longest: int = 0
    longest_id: str = ""
    longest_source: str = ""

    def add(self, id_: str, length: int, where: str) -> None:
        self.count += 1
        if length > self.longest:
            self.longest, self.longest_id, self.longest_source = length, id_, where

    def extend(self, other: "LongRecords") -> None:
        """`other`'s records after these."""
        count = self.count + other.count
        if other.longest > self.longest:
            self.longest, self.longest_id = other.longest, other.longest_id
            self.longest_source = other.longest_source
        self.count = count

    def said(self, limit: int, policy: str) -> str:
        """What happens to them, for the log and the console ('' where there are none)."""
        if not self.count:
            return ""
        done = {
            "truncate": f"truncated to their first {limit} residues (long_sequences: chunk "
            "embeds every residue)",
            "chunk": f"embedded in overlapping windows of {limit} residues (long_sequences: chunk)",
            "skip": "skipped, and listed in failed_sequences.tsv (long_sequences: skip)",
        }[policy]
        are = "records are" if self.count > 1 else "record is"
        return (
            f"{self.count} {are} longer than {limit} residues, the longest "
            f"{printable(self.longest_id)} ({self.longest:,} residues, {self.longest_source}): "
            f"{done}"
        )


@dataclass
class Found:
    """What a piece's scan found besides its records: the checks' findings."""

    n_records: int = 0
    nucleotide: dict = field(default_factory=dict)  # path -> [count, first ID, its source]
    problems: InputProblems = field(default_factory=InputProblems)
    long: LongRecords = field(default_factory=LongRecords)

    def extend(self, other: "Found") -> None:
        """`other`'s findings after these (the pieces in input order)."""
        self.n_records += other.n_records
        for path, (count, first_id, where) in other.nucleotide.items():
            self.nucleotide.setdefault(path, [0, first_id, where])[0] += count
        self.problems.extend(other.problems)
        self.long.extend(other.long)

    def to_json(self) -> str:
        return json.dumps(
            {
                "n_records": self.n_records,
                "nucleotide": self.nucleotide,
                "problems": self.problems.to_dict(),
                "long": asdict(self.long),
            }
        )

    @classmethod
    def from_json(cls, text: str) -> "Found":
        data = json.loads(text)
        return cls(
            data["n_records"],
            data["nucleotide"],
            InputProblems.from_dict(data["problems"]),
            LongRecords(**data["long"]),
        )


class Piece(NamedTuple):
    """One worker's share of the input: a whole file, or a part of a plain one."""

    number: int  # the file's place among the inputs
    path: str
    part: FilePart | None  # None: the whole file


class Settings(NamedTuple):
    """What every piece's scan needs to know."""

    files: list[str]  # every input, as the record table names them
    truncation_seq_length: int
    long_sequences: str


def pieces(inputs, workers: int) -> list[Piece]:
    """The inputs' pieces in input order: with several workers, a plain file of at least two
    PIECE_BYTES is cut into ranges, about two per worker."""
    found = []
    for number, path in enumerate(map(str, inputs)):
        size = os.path.getsize(path) if os.path.isfile(path) else 0
        n = min(2 * workers, size // PIECE_BYTES) if workers > 1 else 1
        if n < 2 or compression(path) is not None:
            found.append(Piece(number, path, None))
            continue
        starts = header_offsets(path, n)
        ends = starts[1:] + [size]
        with ThreadPoolExecutor(workers) as threads:
            counts = list(threads.map(count_newlines, [path] * len(starts), starts, ends))
        before = np.concatenate([[0], np.cumsum(counts)[:-1]]).tolist()
        found.extend(
            Piece(number, path, FilePart(start, end, int(lines)))
            for start, end, lines in zip(starts, ends, before)
        )
    return found


def scan_piece(piece: Piece, settings: Settings, folder) -> Found:
    """Read, check and spool the records of `piece` into `folder`. A problem is noted and the
    scan goes on (a file that cannot be read, to its end)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    found = Found()
    problems, limit, policy = (
        found.problems,
        settings.truncation_seq_length,
        settings.long_sequences,
    )
    table = ScanWriter(folder / TABLE, settings.files)
    ids, lengths, digests = [], [], bytearray()
    with (
        open(folder / SEQUENCES, "wb") as spool,
        open(folder / DIGESTS, "wb") as digests_out,
        open(folder / LENGTHS, "wb") as lengths_out,
        open(folder / HASHES, "wb") as hashes_out,
    ):

        def write_out():
            digests_out.write(digests)
            lengths_out.write(np.array(lengths, dtype=np.int32).tobytes())
            hashes_out.write(id_hashes(ids).view(np.int64).tobytes())
            del digests[:], lengths[:], ids[:]

        path = piece.path
        try:
            for record in read_raw(
                path,
                lambda err: problems.add("bad_record", str(err).removesuffix(FIX_RECORD)),
                piece.part,
            ):
                length = len(record.sequence)
                lengths.append(length)
                ids.append(record.id)
                if length > limit:
                    where = source(path, record.line)
                    found.long.add(record.id, length, where)
                    if policy == "fail":
                        problems.add(
                            "too_long", f"{record.id} ({length} residues > {limit}, {where})"
                        )
                if looks_nucleotide(record.sequence):
                    seen = found.nucleotide.setdefault(
                        path, [0, record.id, source(path, record.line)]
                    )
                    seen[0] += 1
                digest = hashlib.sha256(record.sequence)
                digests += digest.digest()
                sha256 = digest.hexdigest()
                spool.write(
                    b"%s\t%s\t%s\n" % (sha256.encode(), record.id.encode(), record.sequence)
                )
                # The space after the ID goes; other whitespace (a tab) stays, so that the
                # header is the ID and its description again (esmshard.steps.merge)
                description = record.header[len(record.id) :].removeprefix(" ")
                table.add(
                    record.id,
                    sha256,
                    length,
                    record.n_replaced,
                    piece.number,
                    record.line,
                    description,
                )
                found.n_records += 1
                if len(ids) == RECORDS_AT_ONCE:
                    write_out()
        except FastaError as err:
            problems.add("unreadable", str(err))
        write_out()
    table.close()
    return found


class PieceScan(NamedTuple):
    """A scanned piece: its folder (the files named above) and its findings."""

    folder: Path
    found: Found


def scan(inputs, folder, settings: Settings, workers: int = 1) -> Iterator[PieceScan]:
    """Every piece of `inputs` scanned into its own folder under `folder`, `workers` at a time,
    yielded in input order as each is done. One worker, or input smaller than PIECE_BYTES, is
    scanned in this process (a process's start costs a second)."""
    todo = [
        (piece, Path(folder) / f"piece-{k:05d}") for k, piece in enumerate(pieces(inputs, workers))
    ]
    sizes = (os.path.getsize(path) for path in map(str, inputs) if os.path.isfile(path))
    if workers <= 1 or len(todo) == 1 or sum(sizes) < PIECE_BYTES:
        for piece, piece_folder in todo:
            yield PieceScan(piece_folder, scan_piece(piece, settings, piece_folder))
        return
    running, todo = deque(), iter(todo)
    try:
        for job in islice(todo, workers):
            running.append(_start(*job, settings))
        while running:
            process, piece, piece_folder = running.popleft()
            found = _finish(process, piece, piece_folder)
            job = next(todo, None)
            if job:
                running.append(_start(*job, settings))
            yield PieceScan(piece_folder, found)
    finally:
        for process, _, _ in running:
            process.kill()
            process.wait()


def _start(piece: Piece, folder: Path, settings: Settings):
    folder.mkdir(parents=True)
    task = json.dumps({"piece": piece, "settings": settings._asdict(), "folder": str(folder)})
    with open(folder / "stderr", "wb") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-m", __name__, task],
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            preexec_fn=_end_with_parent,
        )
    return process, piece, folder


def _end_with_parent() -> None:
    """A worker ends with the step's process, even one killed with SIGKILL (Linux)."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


class ReaderStopped(ValueError):
    """A reading process ended by a signal (killed by hand or for memory): nothing of the step
    was written, and the same command reads again."""


def _finish(process, piece: Piece, folder: Path) -> Found:
    if process.wait():
        said = (folder / "stderr").read_text(errors="replace").strip().splitlines()
        where = piece.path + (f" from byte {piece.part.start}" if piece.part else "")
        if process.returncode < 0:  # a signal, not an error of its own
            name = signal.Signals(-process.returncode).name
            raise ReaderStopped(
                f"the process reading {where} (process {process.pid}) was stopped by {name} "
                "(by hand, or by the system for memory): nothing of the shard step was "
                "written; run the same command again"
            )
        raise RuntimeError(
            f"the process reading {where} failed (exit status {process.returncode}): "
            + (said[-1] if said else "no message")
        )
    return Found.from_json((folder / FOUND).read_text())


def main(task: str) -> None:
    task = json.loads(task)
    number, path, part = task["piece"]
    piece = Piece(number, path, FilePart(*part) if part else None)
    found = scan_piece(piece, Settings(**task["settings"]), task["folder"])
    (Path(task["folder"]) / FOUND).write_text(found.to_json())


if __name__ == "__main__":
    main(sys.argv[1])
