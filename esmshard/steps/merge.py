"""Merging the parts that hold a run's sequences into one HDF5 file in input order, with the
list of failed records.

The parts are shard files (esmshard.store.shardfile) of this run and of the store; each record's
part is in the record table, and its row there is found by its sequence's key. Streaming, with
memory bounded apart from 9 to 30 bytes per record (status, length and row in its part; the
output row; the per-residue and contact offsets where included): the record table is read once
into a file of records per part (PartMembers), each part's records are checked and copied a
chunk at a time, its rows read in blocks and placed by their rows in the output; the output is
built a window of rows at a time (WINDOW_BYTES), through spill files when it has more than one
window, and each window is written at once. With `output_values: in_place`, where each
protein's values are is written instead of a copy (esmshard.embeddings_h5.in_place).
"""

import json
import logging
import shutil
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import h5py
import numpy as np

from ..compute.telemetry import peak_memory_mb
from ..embeddings_h5 import contacts
from ..embeddings_h5.representations import (
    KINDS,
    PER_TOK_OFFSETS,
    SQUARE,
    TRIANGLE,
    UNLAYERED,
)
from ..files import temporary_folder, write_json, write_tsv
from ..input.records import source
from ..store import (
    Store,
    check_part,
    part_problem,
    rows_of,
    set_aside,
    settings_key,
)
from ..store.runlock import current_run
from ..store.shardfile import dataset, read_index
from ..version import __version__
from . import provenance
from .merge_output import Output
from .merge_rows import (
    PartMembers,
    PartRows,
    record_rows,
)
from .progress import read_metrics

log = logging.getLogger(__name__)

FAILED_COLUMNS = ["id", "source", "reason"]
# The representations' type in embeddings.h5: float16 halves the file; its values are read
# back within a relative 2**-11 (half a unit in the last place), and larger than 65504 refused.
OUTPUT_DTYPES = {"float32": np.float32, "float16": np.float16}
# output_values: auto leaves the values in place when a copy would be larger than this.
AUTO_IN_PLACE_BYTES = 100 << 30


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


def merge(
    records,
    plan_json,
    store_root,
    out_h5,
    failed_tsv,
    run_json,
    settings: dict,
    checksum_cache,
    output_dtype: str = "float32",
    per_residue_compression: str = "none",
    contacts_dtype: str = "float16",
    metrics_files=(),
    run_lock: str | None = None,
    output_values: str = "copy",
) -> dict:
    """Stream the parts that hold the run's sequences into `out_h5`, every record in input order
    (records with one sequence get the same rows); every record lands there or in `failed_tsv`.

    The parts are this run's shards and the store's (`store_root`, esmshard.store), as
    `plan_json` and the record table say. Each must be the part it is named as, computed with
    `settings` (the run's embedding settings), and hold its records' sequences: anything else
    is set aside and refused by name rather than merged into a wrong answer. `run_json` gets the
    run's counts: `computed` by the plan, and `computed_by_this_command`, the sequences of the
    shards whose metrics (`metrics_files`) carry the run id of the command now running (the
    holder of `run_lock`, as esmshard.store.runlock.current_run records it: also its command
    line, folder and start, which run.json names).

    `output_values`: `copy` writes the representations into `out_h5`; `in_place` writes where
    each protein's are in the parts instead (esmshard.embeddings_h5.in_place); `auto`, in place when they
    would pass AUTO_IN_PLACE_BYTES.
    """
    plan = json.loads(Path(plan_json).read_text())
    store, key = Store(str(store_root)), plan["key"]
    if settings_key(settings) != key:
        raise MergeError(
            f"{plan_json} was planned with other embedding settings than this run's; delete "
            f"{Path(plan_json).parent} and run the same command again"
        )
    with temporary_folder(Path(out_h5).parent, "merge-spill") as spill_dir:
        members = PartMembers(spill_dir, records)
        scan = scan_parts(members, store, key, plan["plan"], records, checksum_cache)
        dtype = OUTPUT_DTYPES[output_dtype]
        shapes = output_shapes(scan, settings["include"], dtype, contacts_dtype)
        in_place = output_values == "in_place" or (
            output_values == "auto" and shapes.size() > AUTO_IN_PLACE_BYTES
        )
        card = provenance.made_by(settings, key, ",".join(sorted(scan.precisions)), checksum_cache)
        attrs = output_attributes(scan, shapes, card, settings, output_dtype, in_place,
                                  per_residue_compression, contacts_dtype)  # fmt: skip
        output = Output(out_h5, records, spill_dir, per_residue_compression, in_place)
        output.write(scan, shapes, members, attrs)
    write_failed(failed_tsv, records, scan.failures)
    # where embeddings.h5's values are: in the file, or in the store's parts
    values_at = {"output_values": "in_place" if in_place else "copy",
                 "store": str(Path(store_root).resolve())}  # fmt: skip
    counts = run_counts(plan, scan, shapes, settings, card, metrics_files, run_lock, values_at)
    write_json(run_json, counts)
    log.info(
        "%d records, %d unique sequences: %d computed (%d by this command, %d kept from stopped "
        "jobs), %d from the store; %d records failed",
        counts["records"],
        counts["unique_sequences"],
        counts["computed"],
        counts["computed_by_this_command"],
        counts["kept_from_stopped_jobs"],
        counts["from_store"],
        counts["failed"],
    )
    return counts


def output_attributes(
    scan: Scan, shapes: Shapes, card, settings, output_dtype, in_place, compression, contacts_dtype
) -> dict:
    """embeddings.h5's attributes: the run's card (esmshard.steps.provenance), its counts and
    settings, and how the values are held."""
    attrs = {name: -1 if value is None else value for name, value in card.items()}
    attrs.update(
        truncation_seq_length=scan.attrs["truncation_seq_length"],
        n_embedded=shapes.n_embedded,
        n_failed=len(scan.failures),
        settings=json.dumps(settings),
        output_dtype=output_dtype,
        output_values="in_place" if in_place else "copy",
        per_residue_compression=compression,
        contacts_dtype=contacts_dtype
        if any(k.rows in (TRIANGLE, SQUARE) for k in shapes.unlayered)
        else "",
        **provenance.attributes(scan.computed_rows),
    )
    return attrs


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


def write_failed(failed_tsv, records, failures: dict) -> None:
    """Write failed.tsv: each failed record's ID, source and reason, in input order."""
    failed = sorted(failures)
    rows = record_rows(records, ["id", "file", "line"], failed)
    write_tsv(
        failed_tsv,
        FAILED_COLUMNS,
        [[id_, source(file, line), failures[i]] for i, (id_, file, line) in zip(failed, rows)],
    )


def run_counts(
    plan, scan: Scan, shapes: Shapes, settings, card, metrics_files, run_lock, values_at: dict
) -> dict:
    """run.json's counts: the records and where their sequences came from, where the values
    are (`values_at`), the command that merged, and how the parts were computed."""
    command = current_run(run_lock) if run_lock else {}
    run_id = command.get("run_id")
    return {
        "records": int(scan.status.size),
        "unique_sequences": plan["unique_sequences"],
        "computed": plan["computed"],
        **_computed_by(metrics_files, run_id),
        "run_id": run_id,
        "from_store": plan["from_store"],
        "embedded": shapes.n_embedded,
        "failed": len(scan.failures),
        **values_at,
        # records beyond truncation_seq_length, by what long_sequences did with them
        "inputs": plan.get("inputs", []),
        # the command that merged: its command line, folder, start, and the merge's end
        "command": command.get("command"),
        "typed_command": command.get("typed_command"),
        "workdir": command.get("workdir"),
        "started_at": command.get("started_at"),
        "planned_at": plan.get("planned_at"),  # the run's first command planned it
        "finished_at": time.time(),
        "long_records": plan.get("long_records", 0),
        "long_sequences": plan.get("long_sequences", settings["long_sequences"]),
        "long_said": plan.get("long_said", ""),
        "made_by": card,
        "esmshard_version": __version__,
        "precisions": sorted(scan.precisions),
        "devices": sorted({row["device_name"] for row in scan.computed_rows}),
        "computed_with": scan.computed_rows,
    }


def _computed_by(metrics_files, run_id) -> dict[str, int]:
    """The sequences that the command `run_id`'s jobs computed themselves, and those that
    stopped jobs (of any command) kept and no later job computed again (esmshard.store.pieces)."""
    metrics = [read_metrics(path) for path in metrics_files]

    def kept(m):
        return m.get("kept_sequences", 0) if isinstance(m.get("kept_sequences"), int) else 0

    return {
        "computed_by_this_command": sum(
            m["n_sequences"] - kept(m) for m in metrics if run_id and m.get("run_id") == run_id
        ),
        "kept_from_stopped_jobs": sum(kept(m) for m in metrics),
        # the same in residues, the unit of the progress and the report
        "residues_kept_from_stopped_jobs": sum(
            m["kept_residues"] for m in metrics if isinstance(m.get("kept_residues"), int)
        ),
    }


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
