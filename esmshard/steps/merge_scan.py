"""The merge step's first pass: each record's status, length and row in its part (Scan), and
the output's rows and datasets (Shapes)."""

import logging
import shutil
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import h5py
import numpy as np

from ..compute import provenance
from ..compute.telemetry import peak_memory_mb
from ..embeddings_h5 import contacts
from ..embeddings_h5.representations import KINDS, PER_TOK_OFFSETS, SQUARE, TRIANGLE, UNLAYERED
from ..input.records import source
from ..store import check_part, part_problem, rows_of, set_aside
from ..store.shardfile import dataset, read_index
from .merge_rows import PartMembers, PartRows, record_rows

log = logging.getLogger(__name__)


class MergeError(RuntimeError):
    """A shard file that does not match its shard, or records unaccounted for."""


@dataclass
class Scan:
    """What the first pass over the parts' small datasets found: each record's status, length
    and row in its part, the failures' reasons, and what the parts say of how they were made."""

    paths: list[str]  # each part of the record table, by its code
    status: np.ndarray  # 0 missing, 1 embedded, 2 failed
    lengths: np.ndarray
    part_row: np.ndarray  # the record's row in its part
    failures: dict = field(default_factory=dict)
    precisions: set = field(default_factory=set)
    used: list = field(default_factory=list)  # the parts that hold any of the run's records
    attrs: dict | None = None
    layers: dict = field(default_factory=dict)
    computed_rows: list = field(default_factory=list)

    def parts(self, members: PartMembers):
        """Each part's embedded records by their row in it, a chunk of records at a time."""
        for code, path in enumerate(self.paths):
            for entries in members.chunks(code):
                chunk = entries["index"][self.status[entries["index"]] == 1]
                order = np.argsort(self.part_row[chunk], kind="stable")
                yield PartRows(path, self.part_row[chunk][order], chunk[order])


class Shapes(NamedTuple):
    """The output's rows and datasets: which records are embedded and at which row, where
    each protein's rows start in the datasets of several, and each dataset's shape and dtype."""

    embedded: np.ndarray
    n_embedded: int
    row_of: np.ndarray
    starts: dict  # each dataset of offsets: where each protein's rows start
    values: dict  # each dataset of the values: its shape and dtype
    unlayered: list

    def size(self) -> int:
        """The bytes of every dataset of the values."""
        return sum(int(np.prod(shape)) * dtype.itemsize for shape, dtype in self.values.values())


def scan_parts(members: PartMembers, store, key, plan_name, records, checksum_cache) -> Scan:
    """Check each part the run uses and read which of its records succeeded, their rows and
    lengths; a part that cannot be merged is set aside and the run stopped."""
    n = members.n
    scan = Scan(
        [store.part(key, name) for name in members.names],
        np.zeros(n, dtype=np.int8),
        np.zeros(n, dtype=np.int32),
        np.zeros(n, dtype=np.uint32),
    )
    computed_with = Counter()
    for code, (name, path) in enumerate(zip(members.names, scan.paths)):
        if not members.has(code):
            continue  # a store part that the shard step found and did not use
        scan.used.append(path)
        from_store = not name.startswith(plan_name)
        part = checked_part(store, key, name, path, from_store, records, checksum_cache)
        scan.attrs, scan.layers = part.attrs, part.layers
        first_lost, n_lost = mark_records(scan, members.chunks(code), part)
        if n_lost:
            id_, file, line = record_rows(records, ["id", "file", "line"], [first_lost])[0]
            reason = (
                f"it holds no result for record '{id_}' ({source(file, line)}) nor for "
                f"{n_lost - 1} more of the records it should"
            )
            _set_aside_and_stop(store, key, name, reason, from_store, records)
        scan.precisions.add(str(part.attrs["precision"]))
        computed_with[provenance.computed_with(part.attrs)] += 1
    scan.computed_rows = provenance.summary(computed_with)
    log.info("%d parts checked (%d records); peak memory so far %.0f MB", len(scan.used), n,
             peak_memory_mb())  # fmt: skip
    missing = np.flatnonzero(scan.status == 0)
    if missing.size:
        first = record_rows(records, ["id", "file", "line"], missing[:1])[0]
        raise MergeError(
            f"{missing.size} input records are in no shard file, e.g. '{first[0]}' "
            f"({source(first[1], first[2])})"
        )
    return scan


def checked_part(store, key, name, path, from_store, records, checksum_cache):
    """The index of part `name`, once it is found to be the part it is named as."""
    # A store part may have changed since the shard step checked it; this run's own are new.
    reason = (
        check_part(store, key, name, checksum_cache)
        if from_store
        else part_problem(store, key, name)
    )
    if reason:
        _set_aside_and_stop(store, key, name, reason, from_store, records)
    try:
        with h5py.File(path, "r") as h5:
            return read_index(h5)
    except (OSError, KeyError) as err:
        _set_aside_and_stop(
            store, key, name, f"unreadable or incomplete ({err})", from_store, records
        )


def mark_records(scan: Scan, chunks, part) -> tuple[int | None, int]:
    """Mark the records of `chunks` that `part` holds as embedded or failed; return the first
    record it should hold and does not, and how many such records there are."""
    first_lost, n_lost = None, 0
    # a chunk at a time: a part's records may be millions (repeated sequences)
    for entries in chunks:
        chunk, keys = entries["index"], entries["key"]
        rows = rows_of(part.keys, keys)
        failed_at = rows_of(part.failed_keys, keys)
        lost = chunk[(rows < 0) & (failed_at < 0)]
        if lost.size and first_lost is None:
            first_lost = int(lost[0])
        n_lost += lost.size
        done = rows >= 0
        scan.status[chunk[done]] = 1
        scan.part_row[chunk[done]] = rows[done]
        scan.lengths[chunk[done]] = part.lengths[rows[done]]
        for k in np.flatnonzero(~done & (failed_at >= 0)):
            scan.status[chunk[k]] = 2
            scan.failures[int(chunk[k])] = part.failed_reasons[failed_at[k]]
    return first_lost, n_lost


def output_shapes(scan: Scan, include, dtype, contacts_dtype) -> Shapes:
    """The output's rows, offsets and the shape and dtype of each of its datasets of values."""
    embedded = scan.status == 1
    n_embedded = int(embedded.sum())
    row_of = np.cumsum(embedded, dtype=np.int32 if embedded.size < 2**31 else np.int64)
    row_of -= 1  # in place: no second array per record
    kept = scan.lengths[embedded]
    unlayered = [UNLAYERED[name] for name in include if name in UNLAYERED]
    starts = {}
    if any(KINDS[kind].per_residue for kind in scan.layers):
        starts[PER_TOK_OFFSETS] = KINDS["per_tok"].starts(kept)
    for kind in unlayered:
        if kind.offsets:
            starts[kind.offsets] = kind.starts(kept)
    dim = _dim(scan.used[0], scan.layers) if scan.layers else 0
    values = {}
    for kind, kind_layers in scan.layers.items():
        total = int(starts[PER_TOK_OFFSETS][-1]) if KINDS[kind].per_residue else n_embedded
        values.update(
            {dataset(kind, layer): ((total, dim), np.dtype(dtype)) for layer in kind_layers}
        )
    for kind in unlayered:
        total = int(starts[kind.offsets][-1]) if kind.offsets else n_embedded
        width = _row_shape(scan.used[0], kind) if scan.used else ()
        values[kind.values] = ((total, *width), _dtype_of(kind, dtype, contacts_dtype))
    return Shapes(embedded, n_embedded, row_of, starts, values, unlayered)


def _set_aside_and_stop(store, key, name, reason, from_store, records) -> None:
    """A part that cannot be merged is set aside, and the run stops so that the same command
    recomputes its sequences: a part of this run's plan is an embed job's output, which Snakemake
    runs again once it is missing; for a store part, the plan is removed, so that the shard step
    plans its sequences anew."""
    moved = set_aside(store, key, name, reason)
    if from_store:
        shutil.rmtree(Path(records).parent, ignore_errors=True)
    raise MergeError(
        f"store part {store.part(key, name)} cannot be merged: {reason}. It is set aside "
        f"({' and '.join(moved) or 'already gone'}) and nothing was merged; run the same "
        "command again: it recomputes that part's sequences (no other step is needed)"
    )


def _dtype_of(kind, output_dtype, contacts_dtype) -> np.dtype:
    """The dtype embeddings.h5 holds an unlayered kind in: contact and attention maps in
    `contacts_dtype` (values of 0 to 1 both), per-residue scores in `output_dtype`,
    pseudo-log-likelihoods (sums) in float32."""
    if kind.rows in (TRIANGLE, SQUARE):
        return np.dtype(contacts.DTYPES[contacts_dtype])
    return np.dtype(output_dtype if kind.per_residue else np.float32)


def _row_shape(path, kind) -> tuple[int, ...]:
    """An unlayered kind's row shape, as the parts hold it (the attention maps' width is the
    run's settings')."""
    with h5py.File(path, "r") as h5:
        return h5[kind.values].shape[1:]


def _dim(path, layers) -> int:
    kind, kind_layers = next(iter(layers.items()))
    with h5py.File(path, "r") as h5:
        return h5[dataset(kind, kind_layers[0])].shape[1]
