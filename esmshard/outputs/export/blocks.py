"""Read a run's embeddings.h5 in blocks of proteins, for the export formats: memory
bounded by BLOCK_BYTES, whatever the number of proteins.
"""

import hashlib
import os
from pathlib import Path
from typing import NamedTuple

import numpy as np

from ...embeddings_h5.representations import KINDS, PER_TOK_OFFSETS
from ...input.fasta import printable, read_raw
from ...input.records import iter_batches, source
from ...store.shardfile import dataset
from ..reader import Embeddings

BLOCK_BYTES = 64 << 20
# A protein's ID, header and hash, read as Python strings, take about STRING_BYTES beside its
# values; and a block holds PROTEINS_PER_BLOCK at most.
PROTEINS_PER_BLOCK = 8192
STRING_BYTES = 1024


class ExportError(ValueError):
    """An export that cannot be made as asked; the message says why and what to do."""


class Block(NamedTuple):
    """Proteins `start` .. `start + len(ids)` of embeddings.h5, every dataset the export writes."""

    start: int
    ids: list[str]
    headers: list[str]
    sha256: list[str]
    lengths: np.ndarray
    values: dict[str, dict[int, np.ndarray]]  # kind -> layer -> rows (per residue: concatenated)
    residue_offsets: np.ndarray | None  # per-residue rows of protein i: [i] : [i + 1], from 0
    # unlayered kind -> (its rows, concatenated; where protein i's start, from 0, or None: row i)
    unlayered: dict[str, tuple[np.ndarray, np.ndarray | None]]

    def rows(self, kind: str, i: int) -> dict[int, np.ndarray]:
        """Protein i's values of `kind`: {layer: its vector, or its rows per residue}."""
        if KINDS[kind].per_residue:
            a, b = self.residue_offsets[i : i + 2]
            return {layer: values[a:b] for layer, values in self.values[kind].items()}
        return {layer: values[i] for layer, values in self.values[kind].items()}

    def scores(self, kind: str, i: int) -> np.ndarray:
        """Protein i's rows of an unlayered `kind` (a contact map's triangle, its scores)."""
        values, offsets = self.unlayered[kind]
        return values[i] if offsets is None else values[offsets[i] : offsets[i + 1]]


def blocks(emb: Embeddings, wanted: dict[str, list[int]], unlayered=()):
    """The file's proteins in blocks of about BLOCK_BYTES of the `wanted` datasets and the
    `unlayered` kinds (their names)."""
    h5, n = emb.h5, len(emb)
    itemsize = {
        kind: emb.stored(dataset(kind, layers[0])).dtype.itemsize
        for kind, layers in wanted.items()
    }
    per_protein = sum(
        emb.dim * itemsize[kind] * len(layers)
        for kind, layers in wanted.items()
        if not KINDS[kind].per_residue
    )
    per_residue = sum(
        emb.dim * itemsize[kind] * len(layers)
        for kind, layers in wanted.items()
        if KINDS[kind].per_residue
    )
    residue_offsets = h5[PER_TOK_OFFSETS] if per_residue else None
    rows = {}  # unlayered kind -> (its values, its offsets or None, bytes per row)
    for name in unlayered:
        data = emb.stored(KINDS[name].values)
        offsets = KINDS[name].offsets
        row_bytes = data.dtype.itemsize * int(np.prod(data.shape[1:]))
        rows[name] = (data, h5[offsets] if offsets else None, row_bytes)
    start = 0
    while start < n:
        # The cost of the next proteins, from their offsets.
        stop_at = min(n, start + PROTEINS_PER_BLOCK)
        cost = np.full(stop_at - start, per_protein + STRING_BYTES, dtype=np.int64)
        if residue_offsets is not None:
            cost += np.diff(residue_offsets[start : stop_at + 1]) * per_residue
        for _, offsets, row_bytes in rows.values():
            cost += (
                row_bytes if offsets is None else np.diff(offsets[start : stop_at + 1]) * row_bytes
            )
        stop = start + max(1, int(np.searchsorted(np.cumsum(cost), BLOCK_BYTES, side="right")))
        yield _read_block(emb, wanted, start, stop, residue_offsets, rows)
        start = stop


def _read_block(emb, wanted, start, stop, residue_offsets, unlayered) -> Block:
    h5 = emb.h5
    values, bounds = {}, None
    if residue_offsets is not None:
        bounds = residue_offsets[start : stop + 1]
    for kind, layers in wanted.items():
        rows = slice(bounds[0], bounds[-1]) if KINDS[kind].per_residue else slice(start, stop)
        values[kind] = {layer: emb.stored(dataset(kind, layer))[rows] for layer in layers}
    scores = {}
    for name, (data, offsets, _) in unlayered.items():
        if offsets is None:
            scores[name] = (data[start:stop], None)
        else:
            at = offsets[start : stop + 1]
            scores[name] = (data[at[0] : at[-1]], at - at[0])
    return Block(
        start=start,
        ids=emb.ids(start, stop),
        headers=h5["headers"].asstr()[start:stop].tolist(),
        sha256=[d.decode() for d in h5["sequence_sha256"][start:stop]],
        lengths=h5["lengths"][start:stop],
        values=values,
        residue_offsets=None if bounds is None else bounds - bounds[0],
        unlayered=scores,
    )


def biotrainer_hash(sequence: bytes) -> str:
    """biotrainer's H5 key: SHA-256 of "<sequence>_<length>" (its h5_file_standardization)."""
    return hashlib.sha256(sequence + b"_%d" % len(sequence)).hexdigest()


def sequences_in_order(emb: Embeddings, records_path: str, workdir: str):
    """The embedded proteins' sequences, in the file's order, read again from the run's input
    FASTA files (the record table names them, relative to `workdir`, where the run ran) and
    checked against their sha256."""
    files = []
    for batch in iter_batches(records_path, ["file"]):
        for name in batch.column("file").unique().to_pylist():
            if name not in files:
                files.append(name)
    wanted = (
        (id_, sha256)
        for start in range(0, len(emb), PROTEINS_PER_BLOCK)
        for id_, sha256 in zip(
            emb.ids(start, start + PROTEINS_PER_BLOCK),
            emb.h5["sequence_sha256"][start : start + PROTEINS_PER_BLOCK],
        )
    )
    next_row = next(wanted, None)
    for file in (os.path.join(workdir, name) for name in files):
        if not Path(file).is_file():
            raise ExportError(
                f"hash keys need the run's sequences, but its input {file} is not there (moved "
                "or removed since the run); put it back, or key the datasets by ID (--key id)"
            )
        for record in read_raw(file):
            if next_row is None:
                return
            id_, sha256 = next_row
            if record.id != id_:
                continue
            if hashlib.sha256(record.sequence).hexdigest().encode() != sha256:
                raise ExportError(
                    f"record '{printable(id_)}' ({source(file, record.line)}) has another sequence than the "
                    "one embedded: the input changed since the run. Run the workflow again, or "
                    "key the datasets by ID (--key id)"
                )
            yield record.sequence
            next_row = next(wanted, None)
    if next_row is not None:
        raise ExportError(
            f"record '{next_row[0]}' of the embeddings is in none of the run's inputs {files}: "
            "they changed since the run. Run the workflow again, or key by ID (--key id)"
        )


class Options(NamedTuple):
    kinds: dict[str, list[int]]  # what to write: kind -> layers
    key: str  # per-protein-h5's dataset names: "hash" or "id"
    records: str  # the run's record table (which names its input files)
    names: str = "id"  # pt's file names: "id" (escaped) or "header" (as fair-esm's extract)
    workdir: str = "."  # where the run ran: its input files' relative paths start there


def warn_truncated(emb, bar, file: str) -> None:
    """One line where a per-residue export holds records truncated at truncation_seq_length:
    fewer rows than residues, which biotrainer's residue protocols refuse."""
    truncated = np.flatnonzero(emb.h5["truncated"][:])
    if truncated.size:
        first = emb.ids(int(truncated[0]), int(truncated[0]) + 1)[0]
        bar.stream.write(
            f"esmshard export: warning: {truncated.size} records were truncated at "
            f"truncation_seq_length (first: {printable(first)}): their rows in {file} "
            "cover the residues embedded only, where biotrainer's residue protocols need one "
            "per residue; leave them out, or run again with a larger truncation_seq_length\n"
        )
