"""Merging shard files into one HDF5 file in input order, with the list of failed records.

Streaming, with memory bounded apart from ~13 bytes per record: each shard file's rows are read
in blocks in the order they were computed and placed by their row in the output; the output is
built a window of rows at a time (WINDOW_BYTES), through spill files when it has more than one
window, and each window is written at once into chunked datasets.
"""

import json
import logging
import os
import tempfile
from pathlib import Path
from typing import NamedTuple

import h5py
import numpy as np

from . import peak_memory_mb
from .files import Buckets, atomic_path, write_tsv
from .records import iter_batches, read_columns, shard_codes, source
from .representations import KINDS
from .shardfile import STR_DTYPE, dataset, read_index

log = logging.getLogger(__name__)

FAILED_COLUMNS = ["id", "source", "reason"]
# The representations' type in embeddings.h5: float16 halves the file; its values are read
# back within a relative 2**-11 (half a unit in the last place), and larger than 65504 refused.
OUTPUT_DTYPES = {"float32": np.float32, "float16": np.float16}
# Lossless compression of the per-residue datasets (HDF5 filters any HDF5 reader has).
COMPRESSIONS = {"none": None, "gzip": "gzip", "lzf": "lzf"}
WINDOW_BYTES = 256 << 20
BLOCK_BYTES = 64 << 20
CHUNK_BYTES = 1 << 20
STRINGS_AT_ONCE = 1 << 18


class MergeError(RuntimeError):
    """A shard file that does not match its shard, or records unaccounted for."""


class Placement(NamedTuple):
    """Where each input record's rows go in embeddings.h5, for every kind of representation."""

    embedded: np.ndarray  # bool per input record
    row_of: np.ndarray  # output row of each embedded record (per-protein datasets)
    offsets: np.ndarray | None  # per-residue datasets: record row r's rows are offsets[r:r+2]


def merge(
    records,
    shard_files,
    out_h5,
    failed_tsv,
    settings: dict,
    output_dtype: str = "float32",
    per_residue_compression: str = "none",
) -> dict:
    """Stream shard files into `out_h5`; every input record lands there or in `failed_tsv`.

    Each shard file must be its own shard's, computed with `settings` (the run's embedding
    settings): anything else is refused by name rather than merged into a wrong answer.
    """
    dtype = OUTPUT_DTYPES[output_dtype]
    codes, names = shard_codes(read_columns(records, ["shard"]))
    n = codes.size
    id_hashes = np.empty(n, dtype=np.uint32)  # each shard file's IDs are checked against these
    start = 0
    for batch in iter_batches(records, ["id"]):
        ids = batch.column("id").to_pylist()
        id_hashes[start : start + len(ids)] = [id_hash32(i) for i in ids]
        start += len(ids)

    # First pass over the shards' small datasets: which records succeeded, and their lengths.
    status = np.zeros(n, dtype=np.int8)  # 0 missing, 1 embedded, 2 failed
    lengths = np.zeros(n, dtype=np.int32)
    failures, precisions, attrs, layers = {}, set(), None, {}
    code_of = {name: k for k, name in enumerate(names)}
    expected_counts = np.bincount(codes, minlength=len(names))
    for path in shard_files:
        try:
            with h5py.File(path, "r") as h5:
                shard = read_index(h5)
        except (OSError, KeyError) as err:
            raise MergeError(
                f"shard file {path} is unreadable or incomplete ({err}); delete it and run again"
            ) from err
        attrs, layers = shard.attrs, shard.layers
        _check_settings(path, shard.attrs, settings)
        _check_shard(path, records, shard, codes, code_of, expected_counts, id_hashes, status)
        status[shard.index] = 1
        lengths[shard.index] = shard.lengths
        precisions.add(str(attrs["precision"]))
        for failure in shard.failures:
            status[failure.index] = 2
            failures[failure.index] = failure.reason
    del codes, id_hashes
    log.info(
        "%d shard files checked (%d records); peak memory so far %.0f MB",
        len(shard_files),
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
    per_residue = any(KINDS[kind].per_residue for kind in layers)
    offsets = None
    if per_residue:
        offsets = np.zeros(n_embedded + 1, dtype=np.int64)
        np.cumsum(lengths[embedded], out=offsets[1:])
    placement = Placement(embedded, row_of, offsets)

    dim = _dim(shard_files[0], layers) if layers else 0
    itemsize = np.dtype(dtype).itemsize
    total_rows = sum(
        (offsets[-1] if KINDS[kind].per_residue else n_embedded) * len(kind_layers)
        for kind, kind_layers in layers.items()
    )
    size = int(total_rows * dim * itemsize) + (1 << 20)
    out_dir = Path(out_h5).parent
    with (
        atomic_path(out_h5, needed_bytes=2 * size) as tmp,  # the file and its spill files
        h5py.File(tmp, "w") as out,
        tempfile.TemporaryDirectory(dir=out_dir, prefix=".merge-spill-") as spill_dir,
    ):
        _write_text_columns(out, records, embedded, n_embedded)
        log.info("ids and headers written; peak memory so far %.0f MB", peak_memory_mb())
        out.create_dataset("lengths", data=lengths[embedded])
        del lengths
        if per_residue:
            out.create_dataset("per_tok/offsets", data=offsets)
        for kind, kind_layers in layers.items():
            total = int(offsets[-1]) if KINDS[kind].per_residue else n_embedded
            compression = (
                COMPRESSIONS[per_residue_compression] if KINDS[kind].per_residue else None
            )
            for layer in kind_layers:
                name = dataset(kind, layer)
                target = out.create_dataset(
                    name,
                    (total, dim),
                    dtype=dtype,
                    chunks=(max(1, min(total, CHUNK_BYTES // (dim * itemsize))), dim)
                    if total
                    else None,
                    compression=compression,
                )
                _copy_in_input_order(shard_files, name, target, placement, spill_dir)
                log.info("%s written; peak memory so far %.0f MB", name, peak_memory_mb())
        out.attrs.update(
            model=attrs["model"],
            weights=attrs["weights"],
            precision=",".join(sorted(precisions)),
            truncation_seq_length=attrs["truncation_seq_length"],
            n_embedded=n_embedded,
            n_failed=len(failures),
            settings=json.dumps(settings),
            output_dtype=output_dtype,
            per_residue_compression=per_residue_compression,
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
    return {"n_records": n, "n_embedded": n_embedded, "n_failed": len(failures)}


def _check_settings(path, attrs, settings: dict) -> None:
    """The shard file must have been computed with the run's settings, every one of them."""
    try:
        found = json.loads(attrs["settings"])
    except (KeyError, ValueError):
        found = {}
    for key, value in settings.items():
        if found.get(key) != value:
            raise MergeError(
                f"shard file {path} was computed with {key} = {json.dumps(found.get(key))}, but "
                f"this run has {key} = {json.dumps(value)}; it is not this run's (copied from "
                "another run?): delete it and run again to recompute it"
            )


def _check_shard(path, records, shard, codes, code_of, expected_counts, id_hashes, status):
    """The shard file must hold exactly its shard's records, each once, under the right IDs."""
    name = Path(path).stem  # the shard that the file's place stands for
    if shard.attrs.get("shard") != name:
        raise MergeError(
            f"shard file {path} holds shard {shard.attrs.get('shard')}, not {name} "
            "(copied from another shard?): delete it and run again to rebuild it"
        )
    held = np.concatenate([shard.index, np.array([f.index for f in shard.failures], np.int64)])
    code = code_of.get(name, -1)
    expected = int(expected_counts[code]) if code >= 0 else 0
    inside = held[(held >= 0) & (held < codes.size)]
    if (
        held.size != expected
        or inside.size != held.size
        or np.any(codes[held] != code)
        or np.unique(held).size != held.size
        or np.any(status[held] != 0)
    ):
        raise MergeError(
            f"shard file {path} holds {held.size} records where shard {name} has {expected}, "
            "or other records than its own; delete it and run again to rebuild it"
        )
    found = np.fromiter((id_hash32(i) for i in shard.ids), np.uint32, len(shard.ids))
    wrong = np.flatnonzero(found != id_hashes[shard.index])
    if wrong.size:
        index = int(shard.index[wrong[0]])
        (input_id,) = _rows(records, ["id"], [index])[0]
        raise MergeError(
            f"shard file {path}: record {index} is '{shard.ids[wrong[0]]}' where the input has "
            f"'{input_id}'; delete it and run again to rebuild it"
        )


def id_hash32(id_: str) -> int:
    """32 bits of an ID: a shard file of other records differs in most of them, and 4 bytes per
    record keep merge's memory small."""
    return hash(id_) & 0xFFFFFFFF


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


def _write_text_columns(out, records, embedded, n_embedded) -> None:
    """`ids`, `headers` and `truncated` of the embedded records, streamed from the record table."""
    ids = out.create_dataset("ids", (n_embedded,), dtype=STR_DTYPE)
    headers = out.create_dataset("headers", (n_embedded,), dtype=STR_DTYPE)
    truncated = out.create_dataset("truncated", (n_embedded,), dtype=bool)
    row = start = 0
    for batch in iter_batches(records, ["id", "description", "truncated"], STRINGS_AT_ONCE):
        keep = np.flatnonzero(embedded[start : start + batch.num_rows])
        start += batch.num_rows
        if not keep.size:
            continue
        taken = batch.take(keep)
        batch_ids = taken.column("id").to_pylist()
        described = taken.column("description").to_pylist()
        rows = slice(row, row + keep.size)
        ids[rows] = np.array(batch_ids, dtype=object)
        headers[rows] = np.array(
            [f"{i} {d}" if d else i for i, d in zip(batch_ids, described)], dtype=object
        )
        truncated[rows] = taken.column("truncated").to_numpy(zero_copy_only=False)
        row = rows.stop


def _dim(path, layers) -> int:
    kind, kind_layers = next(iter(layers.items()))
    with h5py.File(path, "r") as h5:
        return h5[dataset(kind, kind_layers[0])].shape[1]


def _copy_in_input_order(shard_files, name, target, placement: Placement, spill_dir) -> None:
    """Copy dataset `name` of every shard file into `target`, rows in input order.

    One window of output rows when it fits WINDOW_BYTES; else each block read goes to the spill
    files of the windows its rows fall in, and each window is then assembled and written.
    """
    total, dim = target.shape
    if not total:
        return
    rows_per_window = max(1, WINDOW_BYTES // (dim * target.dtype.itemsize))
    windows = -(-total // rows_per_window)
    spill = Path(spill_dir)
    spills = Buckets([spill / f"{w}.{part}" for w in range(windows) for part in ("rows", "data")])
    whole = np.empty((total, dim), target.dtype) if windows == 1 else None
    for path in shard_files:
        for rows, block in _blocks_with_rows(path, name, placement, target.dtype):
            if whole is not None:
                whole[rows] = block
                continue
            window = rows // rows_per_window
            order = np.argsort(window, kind="stable")
            bounds = np.searchsorted(window[order], np.arange(windows + 1))
            for w in np.flatnonzero(np.diff(bounds)):
                part = order[bounds[w] : bounds[w + 1]]
                spills.add(2 * w, (rows[part] - w * rows_per_window).astype(np.uint32).tobytes())
                spills.add(2 * w + 1, block[part].tobytes())
    if whole is not None:
        target[:] = whole
        return
    spills.flush()
    for w in range(windows):
        first = w * rows_per_window
        buffer = np.empty((min(rows_per_window, total - first), dim), target.dtype)
        rows_file, data_file = spills.paths[2 * w], spills.paths[2 * w + 1]
        if os.path.exists(rows_file):
            rows = np.fromfile(rows_file, np.uint32)
            buffer[rows] = np.fromfile(data_file, target.dtype).reshape(-1, dim)
            os.unlink(rows_file)
            os.unlink(data_file)
        target[first : first + buffer.shape[0]] = buffer


def _blocks_with_rows(path, name, placement: Placement, dtype):
    """Blocks of a shard file's dataset, each with the output row of every one of its rows."""
    kind = name.split("/")[0]
    with h5py.File(path, "r") as h5:
        data = h5[name]
        index = h5["index"][:]
        first_row = placement.row_of[index].astype(np.int64)
        if KINDS[kind].per_residue:
            counts = h5["length"][:]
            first_row = placement.offsets[first_row]
        else:
            counts = np.ones(index.size, dtype=np.int64)
        starts = np.concatenate([[0], np.cumsum(counts)])
        rows_per_record = max(1, int(starts[-1] // max(1, index.size)))
        records_per_block = max(1, BLOCK_BYTES // (data.shape[1] * 4 * rows_per_record))
        for k0 in range(0, index.size, records_per_block):
            k1 = min(index.size, k0 + records_per_block)
            block = data[starts[k0] : starts[k1]]
            if dtype != np.float32:
                block = _narrowed(block, dtype, path, name)
            rows = np.repeat(first_row[k0:k1] - starts[k0:k1], counts[k0:k1]) + np.arange(
                starts[k0], starts[k1]
            )
            yield rows, block


def _narrowed(block: np.ndarray, dtype, path, name) -> np.ndarray:
    """`block` as `dtype`, refusing values that it cannot hold rather than writing infinities."""
    largest = float(np.abs(block).max()) if block.size else 0.0
    if largest > float(np.finfo(dtype).max):
        raise MergeError(
            f"{name} in shard file {path} holds values up to {largest:g}, more than "
            f"{np.dtype(dtype).name} holds ({np.finfo(dtype).max:g}); set output_dtype: float32"
        )
    return block.astype(dtype)
