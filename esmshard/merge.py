"""Merging shard files into one HDF5 file in input order, with the list of failed records."""

import json
import os
from pathlib import Path

import h5py
import numpy as np

from .files import atomic_path, read_tsv, write_tsv
from .representations import KINDS
from .shardfile import dataset, read_index, write_strings

FAILED_COLUMNS = ["id", "source", "reason"]


class MergeError(RuntimeError):
    """A shard file that does not match its shard, or records unaccounted for."""


def merge(records_tsv, shard_files, out_h5, failed_tsv, settings: dict) -> dict:
    """Stream shard files into `out_h5`; every input record lands there or in `failed_tsv`.

    Each shard file must be its own shard's, computed with `settings` (the run's embedding
    settings): anything else is refused by name rather than merged into a wrong answer.
    """
    records = read_tsv(records_tsv)
    ids = [r["id"] for r in records]
    n = len(records)

    expected = {}
    for i, record in enumerate(records):
        expected.setdefault(record["shard"], []).append(i)

    # First pass over the shards' small datasets: which records succeeded, where each row goes.
    status = np.zeros(n, dtype=np.int8)  # 0 missing, 1 embedded, 2 failed
    failures, lengths, precisions, attrs, layers = {}, np.zeros(n, dtype=np.int64), set(), None, {}
    for path in shard_files:
        try:
            with h5py.File(path, "r") as h5:
                shard = read_index(h5)
        except (OSError, KeyError) as err:
            raise MergeError(
                f"shard file {path} is unreadable or incomplete ({err}); delete it and run again"
            ) from err
        attrs, layers = shard.attrs, shard.layers
        lengths[shard.index] = shard.lengths
        _check_settings(path, shard.attrs, settings)
        _check_shard(path, expected, shard, ids)
        status[shard.index] = 1
        precisions.add(str(attrs["precision"]))
        for failure in shard.failures:
            status[failure.index] = 2
            failures[failure.index] = failure.reason
    missing = np.flatnonzero(status == 0)
    if missing.size:
        raise MergeError(
            f"{missing.size} input records are in no shard file, e.g. '{ids[missing[0]]}' "
            f"({records[missing[0]]['source']})"
        )

    embedded = np.flatnonzero(status == 1)  # input order
    row_of = np.full(n, -1, dtype=np.int64)
    row_of[embedded] = np.arange(embedded.size)
    offsets = np.concatenate([[0], np.cumsum(lengths[embedded])])

    size = sum(os.path.getsize(path) for path in shard_files)
    with atomic_path(out_h5, needed_bytes=size) as tmp, h5py.File(tmp, "w") as out:
        write_strings(out, "ids", [ids[i] for i in embedded])
        write_strings(out, "headers", [records[i]["header"] for i in embedded])
        out.create_dataset("lengths", data=lengths[embedded])
        out.create_dataset(
            "truncated", data=np.array([records[i]["truncated"] == "1" for i in embedded])
        )
        if any(KINDS[kind].per_residue for kind in layers):
            out.create_dataset("per_tok/offsets", data=offsets)
        for path in shard_files:
            with h5py.File(path, "r") as h5:
                rows = row_of[h5["index"][:]]
                order = np.argsort(rows)
                for kind, kind_layers in layers.items():
                    for layer in kind_layers:
                        name = dataset(kind, layer)
                        data = h5[name]
                        if name not in out:
                            total = offsets[-1] if KINDS[kind].per_residue else embedded.size
                            out.create_dataset(
                                name, (total, data.shape[1]), dtype=np.float32, chunks=True
                            )
                        if KINDS[kind].per_residue:
                            _copy_residues(h5, data, out[name], offsets, rows)
                        elif rows.size:
                            out[name][rows[order]] = data[:][order]
        out.attrs.update(
            model=attrs["model"],
            weights=attrs["weights"],
            precision=",".join(sorted(precisions)),
            truncation_seq_length=attrs["truncation_seq_length"],
            n_embedded=embedded.size,
            n_failed=len(failures),
            settings=json.dumps(settings),
        )

    write_tsv(
        failed_tsv,
        FAILED_COLUMNS,
        [[ids[i], records[i]["source"], failures[i]] for i in sorted(failures)],
    )
    return {"n_records": n, "n_embedded": int(embedded.size), "n_failed": len(failures)}


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


def _check_shard(path, expected, shard, ids) -> None:
    """The shard file must hold exactly its shard's records, each once, under the right IDs."""
    name = Path(path).stem  # the shard that the file's place stands for
    if shard.attrs.get("shard") != name:
        raise MergeError(
            f"shard file {path} holds shard {shard.attrs.get('shard')}, not {name} "
            "(copied from another shard?): delete it and run again to rebuild it"
        )
    got = sorted(shard.index.tolist() + [f.index for f in shard.failures])
    if got != expected.get(name, []):
        raise MergeError(
            f"shard file {path} holds {len(got)} records where shard {name} has "
            f"{len(expected.get(name, []))}; delete it and run again to rebuild it"
        )
    wrong = [(i, found) for i, found in zip(shard.index.tolist(), shard.ids) if ids[i] != found]
    if wrong:
        raise MergeError(
            f"shard file {path}: record {wrong[0][0]} is '{wrong[0][1]}' where the input has "
            f"'{ids[wrong[0][0]]}'; delete it and run again to rebuild it"
        )


def _copy_residues(h5, data, target, offsets, rows):
    """Per-residue rows of each record, from the shard's processing order to input order."""
    starts = np.concatenate([[0], np.cumsum(h5["length"][:])])
    for k, row in enumerate(rows):
        target[offsets[row] : offsets[row + 1]] = data[starts[k] : starts[k + 1]]
