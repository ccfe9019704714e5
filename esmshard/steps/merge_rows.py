"""The merge's rows: each part's records (read from the record table once), and the copy of a
part's dataset into embeddings.h5 with its rows in input order, a window of rows at a time
(WINDOW_BYTES), through spill files when the output has more than one window.
"""

import os
from pathlib import Path
from typing import NamedTuple

import h5py
import numpy as np

from ..embeddings_h5.in_place import row_counts
from ..embeddings_h5.representations import narrowed
from ..files import Buckets
from ..input.records import iter_batches
from ..store import KEY_DTYPE, keys_of

WINDOW_BYTES = 128 << 20
BLOCK_BYTES = 64 << 20
RECORDS_AT_ONCE = 1 << 20


class Placement(NamedTuple):
    """Where each input record's rows go in one dataset of embeddings.h5."""

    row_of: np.ndarray  # output row of each embedded record (per-protein datasets)
    offsets: np.ndarray | None  # datasets of several rows per protein: record row
    # r's rows are offsets[r:r+2]


def record_rows(records, columns, indices) -> list[tuple]:
    """The record table's `columns` at the (sorted) input `indices`, streaming."""
    indices = np.asarray(indices, dtype=np.int64)
    found, start = [], 0
    for batch in iter_batches(records, columns):
        stop = start + batch.num_rows
        inside = indices[(indices >= start) & (indices < stop)] - start
        if inside.size:
            taken = batch.take(inside)
            found.extend(zip(*(taken.column(c).to_pylist() for c in columns)))
        start = stop
    return found


class PartMembers:
    """The records of each part, read from the record table once: each record's index and
    sequence key in a file per part, read back a chunk at a time, so that no key is held in
    memory per record."""

    ENTRY = np.dtype([("index", np.int64), ("key", KEY_DTYPE)])

    def __init__(self, folder, records):
        self.folder = Path(folder)
        self.names, self.code_of = [], {}
        self.buckets = Buckets([])
        start = 0
        for batch in iter_batches(records, ["shard", "sequence_sha256"]):
            shard = batch.column("shard")
            codes = np.array([self._code(name) for name in shard.dictionary.to_pylist()] or [0])
            codes = codes[shard.indices.to_numpy(zero_copy_only=False)]
            entries = np.empty(batch.num_rows, self.ENTRY)
            entries["index"] = np.arange(start, start + batch.num_rows)
            entries["key"] = keys_of(
                batch.column("sequence_sha256").to_numpy(zero_copy_only=False)
            )
            self.buckets.scatter(codes, entries)
            start += batch.num_rows
        self.buckets.flush()
        self.n = start

    def _code(self, name: str) -> int:
        if name not in self.code_of:
            self.code_of[name] = len(self.names)
            self.names.append(name)
            self.buckets.add_file(self.folder / f"members.{len(self.names)}")
        return self.code_of[name]

    def has(self, code: int) -> bool:
        return os.path.exists(self.buckets.paths[code])

    def chunks(self, code: int):
        """The part's records, RECORDS_AT_ONCE at a time, in input order."""
        if not self.has(code):
            return
        with open(self.buckets.paths[code], "rb") as fh:
            while (entries := np.fromfile(fh, self.ENTRY, RECORDS_AT_ONCE)).size:
                yield entries


class PartRows(NamedTuple):
    """The embedded records that one part holds, by their row in it (a row repeats where
    several records have its sequence)."""

    path: str
    rows: np.ndarray  # ascending
    records: np.ndarray  # the input index of each


def copy_in_input_order(parts, name, target, placement: Placement, spill_dir) -> None:
    """Copy dataset `name` of every part into `target`, rows in input order.

    One window of output rows when it fits WINDOW_BYTES; else each block read goes to the spill
    files of the windows its rows fall in, and each window is then assembled and written.
    """
    # row_shape: (D,), (columns,), or () for contacts
    total, row_shape = target.shape[0], target.shape[1:]
    if not total:
        return
    row_items = int(np.prod(row_shape))
    rows_per_window = max(1, WINDOW_BYTES // (row_items * target.dtype.itemsize))
    windows = -(-total // rows_per_window)
    spill = Path(spill_dir)
    spills = Buckets([spill / f"{w}.{part}" for w in range(windows) for part in ("rows", "data")])
    whole = np.empty(target.shape, target.dtype) if windows == 1 else None
    for part in parts:
        for rows, block in blocks_with_rows(part, name, placement, target.dtype):
            if whole is not None:
                whole[rows] = block
                continue
            window = rows // rows_per_window
            order = np.argsort(window, kind="stable")
            bounds = np.searchsorted(window[order], np.arange(windows + 1))
            for w in np.flatnonzero(np.diff(bounds)):
                chosen = order[bounds[w] : bounds[w + 1]]
                spills.add(2 * w, (rows[chosen] - w * rows_per_window).astype(np.uint32).tobytes())
                spills.add(2 * w + 1, block[chosen].tobytes())
    if whole is not None:
        target[:] = whole
        return
    spills.flush()
    for w in range(windows):
        first = w * rows_per_window
        buffer = np.empty((min(rows_per_window, total - first), *row_shape), target.dtype)
        rows_file, data_file = spills.paths[2 * w], spills.paths[2 * w + 1]
        if os.path.exists(rows_file):
            # a block of the spill files at a time: the window's buffer is the one large array
            row_bytes = row_items * target.dtype.itemsize
            spilled_rows = max(1, BLOCK_BYTES // row_bytes)
            with open(rows_file, "rb") as rows_in, open(data_file, "rb") as data_in:
                while rows := rows_in.read(4 * spilled_rows):
                    at = np.frombuffer(rows, np.uint32)
                    data = data_in.read(at.size * row_bytes)
                    buffer[at] = np.frombuffer(data, target.dtype).reshape(-1, *row_shape)
            os.unlink(rows_file)
            os.unlink(data_file)
        target[first : first + buffer.shape[0]] = buffer


def blocks_with_rows(part: PartRows, name, placement: Placement, dtype):
    """Blocks of the rows of a part's dataset that the run uses, each with their output rows.

    A block spans at most BLOCK_BYTES of the part and is read at once; rows it holds for no
    record are read with it and dropped, rows that several records share are repeated, at most
    a block's worth of records at a time (a few sequences may stand for millions of records).
    """
    if not part.rows.size:
        return
    with h5py.File(part.path, "r") as h5:
        data = h5[name]
        counts = row_counts(name, h5["length"][:])
        starts = np.concatenate([[0], np.cumsum(counts)])
        rows_per_record = max(1, int(starts[-1] // max(1, counts.size)))
        row_items = int(np.prod(data.shape[1:]))
        records_per_block = max(1, BLOCK_BYTES // (row_items * 4 * rows_per_record))
        block_of = part.rows // records_per_block
        edges = np.flatnonzero(np.diff(block_of)) + 1
        for in_block in np.split(np.arange(part.rows.size), edges):
            first = int(starts[part.rows[in_block[0]]])
            block = data[first : int(starts[part.rows[in_block[-1]] + 1])]
            for at in range(0, in_block.size, records_per_block):
                chosen = in_block[at : at + records_per_block]
                rows, records = part.rows[chosen], part.records[chosen]
                n = counts[rows]
                within = np.arange(int(n.sum())) - np.repeat(np.cumsum(n) - n, n)
                source = np.repeat(starts[rows] - first, n) + within
                output_row = placement.row_of[records].astype(np.int64)
                if placement.offsets is not None:
                    output_row = placement.offsets[output_row]
                taken = block[source]
                yield (
                    np.repeat(output_row, n) + within,
                    narrowed(taken, dtype, f"{name} in shard file {part.path}"),
                )
