"""The index of an embeddings.h5's IDs, so that one protein is found by ID in a few reads of the
file whatever its size, instead of reading every ID into memory (~100 bytes each).

Datasets `id_index/hash` (the IDs' 64-bit FNV-1a hashes of their UTF-8 bytes, sorted) and
`id_index/row` (the row of each). A lookup is a binary search of the hashes on disk; equal hashes
(about n²/2⁶⁵ pairs among n IDs: one in 3,700 files of 100M proteins) are settled by reading the
IDs they point to. Files written before the index read as before.
"""

import os
import tempfile
from pathlib import Path

import h5py
import numpy as np

from ..files import Buckets

HASHES, ROWS = "id_index/hash", "id_index/row"
_OFFSET, _PRIME, _MASK = 0xCBF29CE484222325, 0x100000001B3, (1 << 64) - 1


def id_hash(id_: str) -> int:
    """FNV-1a, 64 bits, of the ID's UTF-8 bytes."""
    found = _OFFSET
    for byte in id_.encode():
        found = ((found ^ byte) * _PRIME) & _MASK
    return found


def id_hashes(ids: list[str]) -> np.ndarray:
    """`id_hash` of each ID, as uint64, a byte column at a time for the whole list."""
    encoded = [i.encode() for i in ids]
    if not encoded:
        return np.zeros(0, dtype=np.uint64)
    lengths = np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded))
    width = int(lengths.max()) if len(encoded) else 0
    codes = np.array(encoded, dtype=f"S{max(width, 1)}").view(np.uint8).reshape(len(encoded), -1)
    found = np.full(len(encoded), _OFFSET, dtype=np.uint64)
    prime = np.uint64(_PRIME)
    with np.errstate(over="ignore"):  # the product wraps at 64 bits, as FNV's does
        for column in range(width):
            live = lengths > column
            found[live] = (found[live] ^ codes[live, column]) * prime
    return found


class IdIndexWriter:
    """The index written with memory bounded by one 256th of it: each (hash, row) goes to a
    bucket file by the hash's first byte, and the buckets are sorted one at a time, in order."""

    ENTRY = np.dtype([("hash", np.uint64), ("row", np.uint64)])

    def __init__(self, folder):
        self.buckets = Buckets([Path(folder) / f"id_index.{b}" for b in range(256)])
        self.n = 0

    def add(self, hashes: np.ndarray) -> None:
        """The hashes of the next rows' IDs."""
        entries = np.empty(hashes.size, self.ENTRY)
        entries["hash"], entries["row"] = hashes, np.arange(self.n, self.n + hashes.size)
        self.n += hashes.size
        self.buckets.scatter((hashes >> np.uint64(56)).astype(np.intp), entries)

    def write(self, out: h5py.File) -> None:
        self.buckets.flush()
        hashes = out.create_dataset(HASHES, (self.n,), np.uint64)
        rows = out.create_dataset(ROWS, (self.n,), np.uint32 if self.n < 1 << 32 else np.uint64)
        at = 0
        for path in self.buckets.paths:
            if not os.path.exists(path):
                continue
            entries = np.fromfile(path, self.ENTRY)
            os.unlink(path)
            entries = entries[np.argsort(entries["hash"], kind="stable")]  # equal: by row
            hashes[at : at + entries.size] = entries["hash"]
            rows[at : at + entries.size] = entries["row"]
            at += entries.size


def write_id_index(out: h5py.File, hashes: np.ndarray) -> None:
    """The index of the IDs whose hashes (row order) are `hashes`."""
    with tempfile.TemporaryDirectory() as folder:
        writer = IdIndexWriter(folder)
        writer.add(hashes)
        writer.write(out)


def has_id_index(h5: h5py.File) -> bool:
    return HASHES in h5 and ROWS in h5


def find_row(h5: h5py.File, id_: str) -> int | None:
    """The row of `id_` through the index (a file that has one), or None if it is not there
    (an ID that is not UTF-8, such as `os.fsdecode` makes of other bytes, never is)."""
    try:
        target = np.uint64(id_hash(id_))
    except UnicodeEncodeError:
        return None
    hashes = h5[HASHES]
    low, high = 0, len(hashes)
    while low < high:  # the first hash not below the target, reading one value per step
        middle = (low + high) // 2
        if hashes[middle] < target:
            low = middle + 1
        else:
            high = middle
    ids = h5["ids"].asstr()
    while low < len(hashes) and hashes[low] == target:
        row = int(h5[ROWS][low])
        if ids[row] == id_:
            return row
        low += 1
    return None
