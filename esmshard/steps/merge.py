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
import os
import shutil
import time
from collections import Counter
from pathlib import Path
from typing import NamedTuple

import h5py
import numpy as np

from ..compute.telemetry import peak_memory_mb
from ..embeddings_h5 import contacts
from ..embeddings_h5.id_index import IdIndexWriter, id_hashes
from ..embeddings_h5.in_place import per_residue, row_counts, write_placement
from ..embeddings_h5.representations import (
    KINDS,
    PER_TOK_OFFSETS,
    SQUARE,
    TRIANGLE,
    UNLAYERED,
    kind_of,
    narrowed,
)
from ..files import Buckets, atomic_path, temporary_folder, write_json, write_tsv
from ..input.records import iter_batches, source
from ..store import (
    KEY_DTYPE,
    Store,
    check_part,
    keys_of,
    part_problem,
    rows_of,
    set_aside,
    settings_key,
)
from ..store.runlock import current_run
from ..store.shardfile import SHA256_DTYPE, STR_DTYPE, dataset, read_index
from ..version import __version__
from . import provenance
from .progress import read_metrics

log = logging.getLogger(__name__)

FAILED_COLUMNS = ["id", "source", "reason"]
# The representations' type in embeddings.h5: float16 halves the file; its values are read
# back within a relative 2**-11 (half a unit in the last place), and larger than 65504 refused.
OUTPUT_DTYPES = {"float32": np.float32, "float16": np.float16}
# Lossless compression of the per-residue datasets (HDF5 filters any HDF5 reader has).
COMPRESSIONS = {"none": None, "gzip": "gzip", "lzf": "lzf"}
WINDOW_BYTES = 128 << 20
BLOCK_BYTES = 64 << 20
CHUNK_BYTES = 1 << 20
STRINGS_AT_ONCE = 1 << 16
RECORDS_AT_ONCE = 1 << 20
# output_values: auto leaves the values in place when a copy would be larger than this.
AUTO_IN_PLACE_BYTES = 100 << 30


class MergeError(RuntimeError):
    """A shard file that does not match its shard, or records unaccounted for."""


class Placement(NamedTuple):
    """Where each input record's rows go in one dataset of embeddings.h5."""

    row_of: np.ndarray  # output row of each embedded record (per-protein datasets)
    offsets: np.ndarray | None  # datasets of several rows per protein: record row
    # r's rows are offsets[r:r+2]


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
    dtype = OUTPUT_DTYPES[output_dtype]
    plan = json.loads(Path(plan_json).read_text())
    store, key = Store(str(store_root)), plan["key"]
    if settings_key(settings) != key:
        raise MergeError(
            f"{plan_json} was planned with other embedding settings than this run's; delete "
            f"{Path(plan_json).parent} and run the same command again"
        )
    out_dir = Path(out_h5).parent
    with temporary_folder(out_dir, "merge-spill") as spill_dir:
        members = PartMembers(spill_dir, records)
        n = members.n
        # First pass over the parts' small datasets: which records succeeded, their rows, lengths.
        status = np.zeros(n, dtype=np.int8)  # 0 missing, 1 embedded, 2 failed
        lengths = np.zeros(n, dtype=np.int32)
        part_row = np.zeros(n, dtype=np.uint32)  # the record's row in its part
        failures, precisions, attrs, layers = {}, set(), None, {}
        computed_with = Counter()
        paths = [store.part(key, name) for name in members.names]
        used = []
        for code, (name, path) in enumerate(zip(members.names, paths)):
            if not members.has(code):
                continue  # a store part that the shard step found and did not use
            used.append(path)
            from_store = not name.startswith(plan["plan"])
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
                    part = read_index(h5)
            except (OSError, KeyError) as err:
                _set_aside_and_stop(
                    store, key, name, f"unreadable or incomplete ({err})", from_store, records
                )
            attrs, layers = part.attrs, part.layers
            first_lost, n_lost = None, 0  # records the part should hold and does not
            # a chunk at a time: a part's records may be millions (repeated sequences)
            for entries in members.chunks(code):
                chunk, keys = entries["index"], entries["key"]
                rows = rows_of(part.keys, keys)
                failed_at = rows_of(part.failed_keys, keys)
                lost = chunk[(rows < 0) & (failed_at < 0)]
                if lost.size and first_lost is None:
                    first_lost = int(lost[0])
                n_lost += lost.size
                done = rows >= 0
                status[chunk[done]] = 1
                part_row[chunk[done]] = rows[done]
                lengths[chunk[done]] = part.lengths[rows[done]]
                for k in np.flatnonzero(~done & (failed_at >= 0)):
                    status[chunk[k]] = 2
                    failures[int(chunk[k])] = part.failed_reasons[failed_at[k]]
            if n_lost:
                id_, file, line = _rows(records, ["id", "file", "line"], [first_lost])[0]
                reason = (
                    f"it holds no result for record '{id_}' ({source(file, line)}) nor for "
                    f"{n_lost - 1} more of the records it should"
                )
                _set_aside_and_stop(store, key, name, reason, from_store, records)
            precisions.add(str(attrs["precision"]))
            computed_with[provenance.computed_with(attrs)] += 1
        computed_rows = provenance.summary(computed_with)
        log.info(
            "%d parts checked (%d records); peak memory so far %.0f MB",
            len(used),
            n,
            peak_memory_mb(),
        )
        missing = np.flatnonzero(status == 0)
        if missing.size:
            first = _rows(records, ["id", "file", "line"], missing[:1])[0]
            raise MergeError(
                f"{missing.size} input records are in no shard file, e.g. '{first[0]}' "
                f"({source(first[1], first[2])})"
            )

        embedded = status == 1
        n_embedded = int(embedded.sum())
        row_of = np.cumsum(embedded, dtype=np.int32 if n < 2**31 else np.int64)
        row_of -= 1  # in place: no second array per record
        kept = lengths[embedded]
        unlayered = [UNLAYERED[name] for name in settings["include"] if name in UNLAYERED]
        starts = {}  # each dataset of offsets: where each protein's rows start
        if any(KINDS[kind].per_residue for kind in layers):
            starts[PER_TOK_OFFSETS] = KINDS["per_tok"].starts(kept)
        for kind in unlayered:
            if kind.offsets:
                starts[kind.offsets] = kind.starts(kept)
        dim = _dim(used[0], layers) if layers else 0
        shapes = {}  # each dataset of the values: its shape and dtype
        for kind, kind_layers in layers.items():
            total = int(starts[PER_TOK_OFFSETS][-1]) if KINDS[kind].per_residue else n_embedded
            shapes.update(
                {dataset(kind, layer): ((total, dim), np.dtype(dtype)) for layer in kind_layers}
            )
        for kind in unlayered:
            total = int(starts[kind.offsets][-1]) if kind.offsets else n_embedded
            width = _row_shape(used[0], kind) if used else ()
            shapes[kind.values] = ((total, *width), _dtype_of(kind, dtype, contacts_dtype))
        size = sum(int(np.prod(shape)) * dtype.itemsize for shape, dtype in shapes.values())
        in_place = output_values == "in_place" or (
            output_values == "auto" and size > AUTO_IN_PLACE_BYTES
        )

        def parts():
            """Each part's embedded records by their row in it, a chunk of records at a time."""
            for code, path in enumerate(paths):
                for entries in members.chunks(code):
                    chunk = entries["index"][status[entries["index"]] == 1]
                    order = np.argsort(part_row[chunk], kind="stable")
                    yield PartRows(path, part_row[chunk][order], chunk[order])

        # a copy needs room for the file and its spill files; in place, for the IDs and the rest
        needed = n * 256 + (1 << 20) if in_place else 2 * size + (1 << 20)
        with (
            atomic_path(out_h5, needed_bytes=needed) as tmp,
            h5py.File(tmp, "w") as out,
        ):
            index = IdIndexWriter(spill_dir)
            _write_text_columns(out, records, embedded, n_embedded, index.add)
            index.write(out)
            log.info("ids, headers and their index written; peak memory so far %.0f MB",
                     peak_memory_mb())  # fmt: skip
            out.create_dataset("lengths", data=lengths[embedded])
            del lengths
            for name, values in starts.items():
                out.create_dataset(name, data=values)
            if in_place:
                _write_placement(out, parts(), row_of, n_embedded, shapes)
                log.info("in place: where each protein's values are in the parts, written")
            for name, (shape, out_dtype) in ({} if in_place else shapes).items():
                compression = COMPRESSIONS[per_residue_compression] if per_residue(name) else None
                row_items = int(np.prod(shape[1:]))
                target = out.create_dataset(
                    name,
                    shape,
                    dtype=out_dtype,
                    # Stored whole unless compressed, so that readers can memory-map it.
                    chunks=(max(1, min(shape[0], CHUNK_BYTES // (row_items * out_dtype.itemsize))),
                            *shape[1:])
                    if shape[0] and compression
                    else None,
                    compression=compression,
                )  # fmt: skip
                if kind_of(
                    name
                ).columns:  # a score's columns, by name (logits: the 20 amino acids)
                    target.attrs["columns"] = list(kind_of(name).columns)
                placement = Placement(row_of, starts.get(kind_of(name).offsets))
                _copy_in_input_order(parts(), name, target, placement, spill_dir)
                log.info("%s written; peak memory so far %.0f MB", name, peak_memory_mb())
            card = provenance.made_by(settings, key, ",".join(sorted(precisions)), checksum_cache)
            out.attrs.update(
                {name: -1 if value is None else value for name, value in card.items()}
            )
            out.attrs.update(
                truncation_seq_length=attrs["truncation_seq_length"],
                n_embedded=n_embedded,
                n_failed=len(failures),
                settings=json.dumps(settings),
                output_dtype=output_dtype,
                output_values="in_place" if in_place else "copy",
                per_residue_compression=per_residue_compression,
                contacts_dtype=contacts_dtype
                if any(k.rows in (TRIANGLE, SQUARE) for k in unlayered)
                else "",
                **provenance.attributes(computed_rows),
            )

    failed = sorted(failures)
    write_tsv(
        failed_tsv,
        FAILED_COLUMNS,
        [
            [id_, source(file, line), failures[i]]
            for i, (id_, file, line) in zip(failed, _rows(records, ["id", "file", "line"], failed))
        ],
    )
    command = current_run(run_lock) if run_lock else {}
    run_id = command.get("run_id")
    counts = {
        "records": n,
        "unique_sequences": plan["unique_sequences"],
        "computed": plan["computed"],
        **_computed_by(metrics_files, run_id),
        "run_id": run_id,
        "from_store": plan["from_store"],
        "embedded": n_embedded,
        "failed": len(failures),
        # where embeddings.h5's values are: in the file, or in the store's parts
        "output_values": "in_place" if in_place else "copy",
        "store": str(Path(store_root).resolve()),
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
        "precisions": sorted(precisions),
        "devices": sorted({row["device_name"] for row in computed_rows}),
        "computed_with": computed_rows,
    }
    write_json(run_json, counts)
    log.info(
        "%d records, %d unique sequences: %d computed (%d by this command, %d kept from stopped "
        "jobs), %d from the store; %d records failed",
        n,
        counts["unique_sequences"],
        counts["computed"],
        counts["computed_by_this_command"],
        counts["kept_from_stopped_jobs"],
        counts["from_store"],
        len(failures),
    )
    return counts


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


def _rows(records, columns, indices) -> list[tuple]:
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


def _write_text_columns(out, records, embedded, n_embedded, add_hashes) -> None:
    """`ids`, `headers`, `truncated` and `sequence_sha256` of the embedded records, streamed from
    the record table; the IDs' hashes (esmshard.embeddings_h5.id_index) to `add_hashes`, in row order."""
    ids = out.create_dataset("ids", (n_embedded,), dtype=STR_DTYPE)
    headers = out.create_dataset("headers", (n_embedded,), dtype=STR_DTYPE)
    truncated = out.create_dataset("truncated", (n_embedded,), dtype=bool)
    sha256 = out.create_dataset("sequence_sha256", (n_embedded,), dtype=SHA256_DTYPE)
    row = start = 0
    columns = ["id", "description", "truncated", "sequence_sha256"]
    for batch in iter_batches(records, columns, STRINGS_AT_ONCE):
        keep = np.flatnonzero(embedded[start : start + batch.num_rows])
        start += batch.num_rows
        if not keep.size:
            continue
        taken = batch.take(keep)
        batch_ids = taken.column("id").to_pylist()
        described = taken.column("description").to_pylist()
        rows = slice(row, row + keep.size)
        ids[rows] = np.array(batch_ids, dtype=object)
        add_hashes(id_hashes(batch_ids))
        headers[rows] = np.array(
            [
                i + (f" {d}" if d and not d[0].isspace() else d)
                for i, d in zip(batch_ids, described)
            ],
            dtype=object,
        )
        truncated[rows] = taken.column("truncated").to_numpy(zero_copy_only=False)
        sha256[rows] = np.asarray(
            taken.column("sequence_sha256").to_numpy(zero_copy_only=False), dtype=SHA256_DTYPE
        )
        row = rows.stop


def _write_placement(out, parts, row_of, n_embedded, shapes) -> None:
    """Where each embedded record's values are: its part (of those that hold any) and row;
    `parts`: PartRows, each part's in a run."""
    part_of = np.empty(n_embedded, dtype=np.int32)
    part_rows = np.empty(n_embedded, dtype=np.uint32)
    paths = []
    for part in parts:
        if not part.rows.size:
            continue
        if not paths or paths[-1] != part.path:
            paths.append(part.path)
        at = row_of[part.records]
        part_of[at], part_rows[at] = len(paths) - 1, part.rows
    write_placement(out, paths, part_of, part_rows, shapes)


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


def _copy_in_input_order(parts, name, target, placement: Placement, spill_dir) -> None:
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
        for rows, block in _blocks_with_rows(part, name, placement, target.dtype):
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


def _blocks_with_rows(part: PartRows, name, placement: Placement, dtype):
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
