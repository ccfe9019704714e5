"""Merging shard files into one HDF5 file in input order, with the list of failed records."""
import csv
import os
from pathlib import Path

import h5py
import numpy as np

from .shard import read_tsv

FAILED_COLUMNS = ["id", "source", "reason"]
STR_DTYPE = h5py.string_dtype("utf-8")


class MergeError(RuntimeError):
    """A shard file that does not match its shard, or records unaccounted for."""


def _shard_failures(h5) -> list[tuple[int, str]]:
    return list(zip(h5["failed/index"][:].tolist(), h5["failed/reason"].asstr()[:].tolist()))


def merge(records_tsv, shard_files, out_h5, failed_tsv) -> dict:
    """Stream shard files into `out_h5`; every input record lands there or in `failed_tsv`."""
    out_h5, failed_tsv = Path(out_h5), Path(failed_tsv)
    records = read_tsv(records_tsv)
    ids = [r["id"] for r in records]
    n = len(records)

    expected = {}
    for i, record in enumerate(records):
        expected.setdefault(record["shard"], []).append(i)

    # First pass over the shards' small datasets: which records succeeded, where each row goes.
    status = np.zeros(n, dtype=np.int8)  # 0 missing, 1 embedded, 2 failed
    failures, lengths, precisions, attrs, kinds = {}, np.zeros(n, dtype=np.int64), set(), None, {}
    for path in shard_files:
        try:
            with h5py.File(path, "r") as h5:
                attrs = dict(h5.attrs)
                index = h5["index"][:]
                shard_failures = _shard_failures(h5)
                shard_ids = h5["ids"].asstr()[:].tolist()
                lengths[index] = h5["length"][:]
                kinds = {kind: sorted(int(l) for l in h5[kind]) for kind in ("mean", "per_tok", "bos") if kind in h5}
        except (OSError, KeyError) as err:
            raise MergeError(f"shard file {path} is unreadable or incomplete ({err}); delete it and run again") from err
        _check_shard(path, attrs["shard"], expected, index, shard_ids, [i for i, _ in shard_failures], ids)
        status[index] = 1
        precisions.add(str(attrs["precision"]))
        for i, reason in shard_failures:
            status[i] = 2
            failures[i] = reason
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

    tmp = out_h5.with_name(f".{out_h5.name}.tmp")
    with h5py.File(tmp, "w") as out:
        out.create_dataset("ids", data=np.array([ids[i] for i in embedded], dtype=object), dtype=STR_DTYPE)
        out.create_dataset("headers", data=np.array([records[i]["header"] for i in embedded], dtype=object), dtype=STR_DTYPE)
        out.create_dataset("lengths", data=lengths[embedded])
        out.create_dataset("truncated", data=np.array([records[i]["truncated"] == "1" for i in embedded]))
        if "per_tok" in kinds:
            out.create_dataset("per_tok/offsets", data=offsets)
        for path in shard_files:
            with h5py.File(path, "r") as h5:
                rows = row_of[h5["index"][:]]
                order = np.argsort(rows)
                for kind, layers in kinds.items():
                    for layer in layers:
                        data = h5[f"{kind}/{layer}"]
                        if f"{kind}/{layer}" not in out:
                            total = offsets[-1] if kind == "per_tok" else embedded.size
                            out.create_dataset(f"{kind}/{layer}", (total, data.shape[1]), dtype=np.float32, chunks=True)
                        if kind == "per_tok":
                            _copy_tokens(h5, data, out[f"{kind}/{layer}"], offsets, rows)
                        elif rows.size:
                            out[f"{kind}/{layer}"][rows[order]] = data[:][order]
        out.attrs.update(
            model=attrs["model"], weights=attrs["weights"],
            precision=",".join(sorted(precisions)),
            truncation_seq_length=attrs["truncation_seq_length"],
            n_embedded=embedded.size, n_failed=len(failures),
        )
    os.replace(tmp, out_h5)

    tmp = failed_tsv.with_name(f".{failed_tsv.name}.tmp")
    with open(tmp, "w", newline="") as fh:
        writer = csv.writer(fh, delimiter="\t", lineterminator="\n")
        writer.writerow(FAILED_COLUMNS)
        for i in sorted(failures):
            writer.writerow([ids[i], records[i]["source"], failures[i]])
    os.replace(tmp, failed_tsv)
    return {"n_records": n, "n_embedded": int(embedded.size), "n_failed": len(failures)}


def _check_shard(path, shard, expected, index, shard_ids, failed_index, ids) -> None:
    """The shard file must hold exactly its shard's records, each once, under the right IDs."""
    got = sorted(index.tolist() + failed_index)
    if got != expected.get(shard, []):
        raise MergeError(
            f"shard file {path} holds {len(got)} records where shard {shard} has "
            f"{len(expected.get(shard, []))}; delete it and run again to rebuild it"
        )
    wrong = [(i, found) for i, found in zip(index.tolist(), shard_ids) if ids[i] != found]
    if wrong:
        raise MergeError(
            f"shard file {path}: record {wrong[0][0]} is '{wrong[0][1]}' where the input has "
            f"'{ids[wrong[0][0]]}'; delete it and run again to rebuild it"
        )


def _copy_tokens(h5, data, target, offsets, rows):
    """Per-residue rows of each record, from the shard's processing order to input order."""
    starts = np.concatenate([[0], np.cumsum(h5["length"][:])])
    for k, row in enumerate(rows):
        target[offsets[row]:offsets[row + 1]] = data[starts[k]:starts[k + 1]]
