"""`esmshard export`: a run's embeddings.h5 in the layouts that other tools read, streamed in
blocks of proteins (memory bounded by BLOCK_BYTES, whatever the number of proteins).

FORMATS is the one table of them:
- `per-protein-h5`: one HDF5 dataset per protein, as biotrainer and bio_embeddings read it: one
  kind at one layer, keyed by biotrainer's sequence hash (SHA-256 of "<sequence>_<length>") with
  the record's ID in the `original_id` attribute, or by ID (`--key id`, as ProtTrans' embedder).
  Records with one sequence share its dataset under hash keys (the first record's ID is kept).
- `pt`: a folder of fair-esm extract's files, one `<name>.pt` per protein holding `label` (the
  FASTA header), `representations` (per residue), `mean_representations`,
  `bos_representations` ({layer: tensor}) and `contacts`, as far as the run included them, and
  the scores by their `include` names (`logits`, `masked_marginals`: length × 20; `pll`: 2),
  `attentions` (layers × heads × length × length).
  `<name>` is the ID with every character outside [A-Za-z0-9._-] written as %XX (UTF-8 bytes),
  so no two IDs share a name; `index.tsv` maps IDs to files (a name too long for a filesystem,
  or one that a case-insensitive filesystem confuses with another, gets a hash suffix there).
  With `--names header`, `<name>` is the full FASTA header, as extract names its files
  (`{header}.pt`, a `/` in it making subfolders), for code written for extract's outputs.
- `npy`: a folder of `<kind>_<layer>.npy` (per-protein kinds N × D; per-residue kinds every
  residue, rows of protein i at `per_tok_offsets.npy`[i:i+2]), `<kind>.npy` per unlayered kind
  with `<kind>_offsets.npy` where a protein has several rows (`contacts`: esmshard.embeddings_h5.
  contacts' triangles; `logits`, `masked_marginals`: length × 20 each), and `ids.tsv` (id, sequence_sha256):
  `numpy.load(path, mmap_mode="r")` reads any of them without loading it.
- `parquet`: a Parquet dataset, a folder of `part-NNNNN.parquet` files: one row per protein,
  `id`, `sequence_sha256`, `length` (residues embedded), and a list<float> column
  `<kind>_<layer>` per kind and layer (per-residue kinds: list<list<float>>, a row per residue),
  and a column per score (`logits`, `masked_marginals`: list<list<float>>; `pll`: list<float>);
  the card in each file's schema metadata; nothing else in the folder, which Polars reads by
  name only where it holds Parquet files alone.
- `h5`: embeddings.h5 itself with every value in the file (`output_values: copy`): the portable
  copy of a run whose values are in place in its store (esmshard.embeddings_h5.in_place).
- `biotrainer`: a folder that biotrainer trains on as is: `sequences.fasta` (each record's full
  header, so its TARGET= and SET= attributes, and its residues as embedded on one line: the
  residues biotrainer's FASTA reader keeps and hashes), `embeddings_per_protein.h5` (mean) and
  `embeddings_per_residue.h5` (per_tok), as far as the run has them, at one layer (`--layer`),
  keyed by biotrainer's hash of those lines. A per-residue file with truncated records is
  written with a warning: biotrainer's residue protocols need a row per residue.
- `h5ad`: an AnnData file (anndata, scanpy), written by h5py in AnnData's on-disk format: a
  row per protein, the IDs as `obs_names` with `length`, `truncated` and `sequence_sha256` in
  `obs`, each per-protein kind and layer in `obsm` (`mean_<layer>`, `bos_<layer>`; `pll`), no
  variables, and the card (`made_by`) in `uns["esmshard"]`. Per-residue values and maps do not
  fit a row per protein: they are left out (npy, parquet and pt hold them).

Values are copied as embeddings.h5 holds them (float32 or float16; `pt` holds float32 tensors,
as extract's, which float16 values convert to exactly).
"""

import csv
import hashlib
import json
import os
import re
import signal
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple

import h5py
import numpy as np

from ..embeddings_h5 import attentions, contacts, in_place
from ..embeddings_h5.representations import KINDS, PER_TOK_OFFSETS, UNLAYERED
from ..files import atomic_path, unwritable
from ..input.fasta import printable, read_raw
from ..input.records import iter_batches, source
from ..layout import Layout
from ..store import read_json_object
from ..store.leftovers import remove_dead_temporaries_of
from ..store.shardfile import dataset
from .reader import Embeddings

BLOCK_BYTES = 64 << 20
# A protein's ID, header and hash, read as Python strings, take about STRING_BYTES beside its
# values; and a block holds PROTEINS_PER_BLOCK at most.
PROTEINS_PER_BLOCK = 8192
STRING_BYTES = 1024
SAFE = re.compile(rb"[A-Za-z0-9._-]")
MAX_NAME_BYTES = 200  # file names: most filesystems allow 255 bytes
# The Parquet dataset's files: each of about this many bytes of values, so that readers share
# the files out between their threads and no file grows without bound.
PARQUET_FILE_BYTES = 1 << 30


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


class Stop:
    """The signals that stopped an export (`stoppable`): the first one's name and number."""

    def __init__(self):
        self.signals: list[int] = []

    @property
    def signal(self) -> signal.Signals:
        return signal.Signals(self.signals[0] if self.signals else signal.SIGINT)  # else Ctrl-C


_watching: Stop | None = None  # the `stoppable` block's, for the progress bar to act on


@contextmanager
def stoppable(stop: Stop):
    """Ctrl-C, SIGTERM and a closed terminal (SIGHUP) stop the export inside the block as
    KeyboardInterrupt, recorded in `stop`: at once, or at the next block of proteins where the
    signal lands in a finalizer (h5py frees its objects in weakref callbacks, where Python
    prints the exception and drops it)."""
    global _watching

    def stopped(signum, frame):
        stop.signals.append(signum)
        raise KeyboardInterrupt

    shown_unraisable = sys.unraisablehook

    def unraisablehook(unraisable):
        if not isinstance(unraisable.exc_value, KeyboardInterrupt):  # raised again, below
            shown_unraisable(unraisable)

    signals = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    previous = {signum: signal.signal(signum, stopped) for signum in signals}
    sys.unraisablehook, _watching = unraisablehook, stop
    try:
        yield
    finally:
        sys.unraisablehook, _watching = shown_unraisable, None
        for signum, handler in previous.items():
            signal.signal(signum, handler)


class ProgressBar:
    """Proteins written so far, on one line of stderr (a line per 10% when it is no terminal);
    a stop that a finalizer swallowed ends the export at the next block (`stoppable`)."""

    def __init__(self, total: int, label: str, stream=sys.stderr):
        self.total, self.label, self.stream = total, label, stream
        self.done, self.started, self.shown = 0, time.monotonic(), -1
        self.terminal = stream.isatty()

    def update(self, n: int) -> None:
        if _watching is not None and _watching.signals:
            raise KeyboardInterrupt
        self.done += n
        percent = 100 * self.done // max(1, self.total)
        if self.terminal or percent // 10 > self.shown // 10 or self.done == self.total:
            end = "\r" if self.terminal and self.done < self.total else "\n"
            rate = self.done / max(1e-9, time.monotonic() - self.started)
            self.stream.write(
                f"{self.label}: {self.done:,}/{self.total:,} proteins ({percent}%), "
                f"{rate:,.0f}/s{end}"
            )
            self.stream.flush()
            self.shown = percent


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


def per_protein_file(path) -> h5py.File:
    """An HDF5 file of a dataset per protein. HDF5's newer group format: its original one slows
    to a crawl past ~800,000 datasets in a group; any HDF5 1.10 or later (h5py 2.9 or later)
    reads this one."""
    return h5py.File(path, "w", libver=("v110", "latest"))


def put_protein(out, name: str, values, id_: str) -> None:
    """One protein's values as dataset `name`, gzip-compressed as biotrainer writes them, with
    its record's ID in `original_id`."""
    out.create_dataset(name, data=values, compression="gzip", chunks=True)
    out[name].attrs["original_id"] = id_


BIOTRAINER_FILES = {"mean": "embeddings_per_protein.h5", "per_tok": "embeddings_per_residue.h5"}


def write_biotrainer(emb, target, bar, options: Options):
    target.mkdir()
    sequences = sequences_in_order(emb, options.records, options.workdir)
    files = {kind: per_protein_file(target / name)
             for kind, name in BIOTRAINER_FILES.items() if kind in options.kinds}  # fmt: skip
    try:
        with open(target / "sequences.fasta", "w", encoding="utf-8") as fasta:
            for block in blocks(emb, options.kinds):
                for i, (id_, header) in enumerate(zip(block.ids, block.headers)):
                    sequence = next(sequences)
                    fasta.write(f">{header}\n{sequence.decode('ascii')}\n")
                    name = biotrainer_hash(sequence)
                    for kind, out in files.items():
                        if name not in out:  # a sequence seen before: the same values
                            ((layer, data),) = block.rows(kind, i).items()
                            put_protein(out, name, data, id_)
                bar.update(len(block.ids))
    finally:
        for out in files.values():
            out.attrs.update(emb.made_by)
            out.close()
    if "per_tok" in files:
        warn_truncated(emb, bar, "embeddings_per_residue.h5")


def write_per_protein_h5(emb, target, bar, options: Options):
    ((kind, (layer,)),) = options.kinds.items()
    key = options.key
    sequences = (
        sequences_in_order(emb, options.records, options.workdir) if key == "hash" else None
    )
    with per_protein_file(target) as out:
        for block in blocks(emb, options.kinds):
            for i, id_ in enumerate(block.ids):
                if key == "hash":
                    name = biotrainer_hash(next(sequences))
                    if name in out:
                        continue  # the same sequence: the same values
                else:
                    if "/" in id_ or id_ in (".", ".."):
                        raise ExportError(
                            f"ID '{printable(id_)}' cannot be an HDF5 dataset name ('/' separates groups); "
                            "key the datasets by sequence hash (--key hash)"
                        )
                    name = id_
                put_protein(out, name, block.rows(kind, i)[layer], id_)
            bar.update(len(block.ids))
        out.attrs.update(emb.made_by)
    if KINDS[kind].per_residue:
        warn_truncated(emb, bar, "the export")


def pt_name(id_: str) -> str:
    """A file name for `id_`, the same for no other ID: characters outside [A-Za-z0-9._-]
    (and a leading '.') written as %XX of their UTF-8 bytes; over MAX_NAME_BYTES, cut and
    completed by the SHA-256 of the ID."""
    encoded = "".join(
        chr(b) if SAFE.fullmatch(bytes([b])) and not (k == 0 and b == ord(".")) else f"%{b:02X}"
        for k, b in enumerate(id_.encode())
    )
    if len(encoded) > MAX_NAME_BYTES:
        encoded = encoded[:100] + "~" + hashlib.sha256(id_.encode()).hexdigest()
    return encoded


NAME_MAX = 255  # bytes of one file or folder name on most filesystems


def header_path(header: str) -> str:
    """fair-esm extract's file for a record, `{header}.pt` (a `/` in the header makes
    subfolders); an ExportError where the header cannot be such a path inside the export."""
    parts = f"{header}.pt".split("/")
    why = None
    if header.startswith("/") or any(p in ("", ".", "..") for p in parts):
        why = "it would lie outside the export or name no file"
    elif "\0" in header:
        why = "it holds a NUL character"
    elif any(len(p.encode()) > NAME_MAX for p in parts):
        why = f"a file name over {NAME_MAX} bytes"
    if why:
        raise ExportError(
            f"record header '{printable(header)}' cannot be a file's path ({why}); export with "
            "--names id (files named by escaped ID, index.tsv mapping IDs to files)"
        )
    return "/".join(parts)


# fair-esm extract's key for each representation kind.
PT_KEYS = {
    "per_tok": "representations",
    "mean": "mean_representations",
    "bos": "bos_representations",
}


def write_pt(emb, target, bar, options: Options):
    import torch

    target.mkdir()
    made_by = emb.made_by
    map_layers = len(emb.attention_layers) if attentions.NAME in emb.unlayered else 0
    with open(target / "index.tsv", "w", encoding="utf-8", newline="") as listing:
        # a file named by a header with a tab in it is quoted, as a TSV reader expects
        index = csv.writer(listing, delimiter="\t", lineterminator="\n")
        index.writerow(["id", "file"])
        for block in blocks(emb, options.kinds, emb.unlayered):
            for i, (id_, header) in enumerate(zip(block.ids, block.headers)):
                result = {"label": header, "esmshard": made_by}
                for kind in block.values:
                    result[PT_KEYS[kind]] = {
                        layer: torch.from_numpy(np.array(row, dtype=np.float32))
                        for layer, row in block.rows(kind, i).items()
                    }
                for kind in block.unlayered:
                    values = block.scores(kind, i)
                    if kind == contacts.NAME:
                        values = contacts.full_matrix(values, int(block.lengths[i]))
                    elif kind == attentions.NAME:  # layers × heads × L × L
                        values = attentions.maps(values, int(block.lengths[i]), map_layers)
                    result[kind] = torch.from_numpy(np.array(values, dtype=np.float32))
                if options.names == "header":
                    file = header_path(header)
                    (target / file).parent.mkdir(parents=True, exist_ok=True)
                    try:
                        fh = open(target / file, "xb")
                    except FileExistsError:  # headers equal but for case, on such a filesystem
                        raise ExportError(
                            f"record '{printable(id_)}': {file} is an earlier record's file too; "
                            "export with --names id"
                        ) from None
                else:
                    file = f"{pt_name(id_)}.pt"
                    try:
                        fh = open(target / file, "xb")
                    except FileExistsError:  # a case-insensitive filesystem
                        file = f"{pt_name(id_)}~{hashlib.sha256(id_.encode()).hexdigest()}.pt"
                        fh = open(target / file, "xb")
                with fh:
                    torch.save(result, fh)
                index.writerow([printable(id_), file])
            bar.update(len(block.ids))


class NpyWriter:
    """A .npy file written front to back, a block at a time: no memory map, whose written pages
    would count as the process's memory until the kernel writes them out."""

    def __init__(self, path, dtype, shape):
        from numpy.lib import format as npy

        self.path, self.fh = path, open(path, "wb")
        self.left = int(np.prod(shape)) * np.dtype(dtype).itemsize
        header = {"descr": npy.dtype_to_descr(np.dtype(dtype)), "fortran_order": False}
        npy.write_array_header_1_0(self.fh, {**header, "shape": tuple(shape)})

    def write(self, values: np.ndarray) -> None:
        data = np.ascontiguousarray(values).tobytes()
        self.left -= len(data)
        self.fh.write(data)

    def close(self) -> None:
        self.fh.close()
        if self.left:
            raise ExportError(f"{self.path}: {self.left} bytes short (embeddings.h5 changed?)")


def write_npy(emb, target, bar, options: Options):
    target.mkdir()
    (target / "made_by.json").write_text(json.dumps(emb.made_by, indent=1) + "\n")
    h5 = emb.h5
    files = {}  # (kind, layer) or an unlayered kind -> NpyWriter, filled in the order of the rows
    for kind, layers in options.kinds.items():
        for layer in layers:
            data = emb.stored(dataset(kind, layer))
            files[(kind, layer)] = NpyWriter(
                target / f"{kind}_{layer}.npy", data.dtype, data.shape
            )
    if any(KINDS[kind].per_residue for kind in options.kinds):
        _copy_whole(h5[PER_TOK_OFFSETS], target / "per_tok_offsets.npy")
    for name in emb.unlayered:
        kind = KINDS[name]
        values = emb.stored(kind.values)
        files[name] = NpyWriter(target / f"{name}.npy", values.dtype, values.shape)
        if kind.offsets:
            _copy_whole(h5[kind.offsets], target / f"{name}_offsets.npy")
    with open(target / "ids.tsv", "w", encoding="utf-8") as ids:
        ids.write("id\tsequence_sha256\n")
        for block in blocks(emb, options.kinds, emb.unlayered):
            for kind, layers in block.values.items():
                for layer, values in layers.items():
                    files[(kind, layer)].write(values)
            for name, (values, _) in block.unlayered.items():
                files[name].write(values)
            ids.writelines(f"{printable(i)}\t{s}\n" for i, s in zip(block.ids, block.sha256))
            bar.update(len(block.ids))
    for file in files.values():
        file.close()


def _copy_whole(data, path) -> None:
    """A one-dimensional dataset into a .npy file, a block at a time."""
    out = NpyWriter(path, data.dtype, data.shape)
    step = BLOCK_BYTES // data.dtype.itemsize
    for start in range(0, data.shape[0], step):
        out.write(data[start : start + step])
    out.close()


def parquet_schema(emb: Embeddings, kinds: dict[str, list[int]], scores=()):
    """The Parquet dataset's columns: `id`, `sequence_sha256`, `length`, `<kind>_<layer>`
    (fixed_size_list<float, D>, per residue list<fixed_size_list<float, D>>) and the `scores`
    by name, with the run's card as schema metadata."""
    import pyarrow as pa

    def column(name: str, kind: str):
        """A vector of D values as a fixed-size list (Polars reads a column of them as a 2-D
        array); a protein's rows of them, per residue, as a list of those."""
        stored = emb.stored(name)
        vector = pa.list_(pa.from_numpy_dtype(stored.dtype), stored.shape[1])
        return pa.list_(vector) if KINDS[kind].per_residue else vector

    fields = [("id", pa.string()), ("sequence_sha256", pa.string()), ("length", pa.int32())]
    for kind, layers in kinds.items():
        fields += [(f"{kind}_{layer}", column(dataset(kind, layer), kind)) for layer in layers]
    fields += [(name, column(KINDS[name].values, name)) for name in scores]
    return pa.schema(fields, metadata={b"esmshard": json.dumps(emb.made_by).encode()})


def parquet_table(block: Block, schema):
    """A block's proteins as one Parquet row group."""
    import pyarrow as pa

    def vectors(values: np.ndarray):
        return pa.FixedSizeListArray.from_arrays(pa.array(values.reshape(-1)), values.shape[1])

    columns = [pa.array(block.ids), pa.array(block.sha256), pa.array(block.lengths, pa.int32())]
    for kind, layers in block.values.items():
        for values in layers.values():
            column = vectors(values)
            if KINDS[kind].per_residue:
                offsets = pa.array(block.residue_offsets.astype(np.int32))
                column = pa.ListArray.from_arrays(offsets, column)
            columns.append(column)
    for name in schema.names[len(columns) :]:  # the scores
        values, offsets = block.unlayered[name]
        column = vectors(values)
        if offsets is not None:
            column = pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), column)
        columns.append(column)
    return pa.Table.from_arrays(columns, schema=schema)


def write_parquet(emb, target, bar, options: Options):
    """A folder of Parquet files, `part-00000.parquet` on, each of about PARQUET_FILE_BYTES in
    row groups of one block (at most PROTEINS_PER_BLOCK proteins, about BLOCK_BYTES): the
    dataset that pyarrow, DuckDB, Polars, pandas and Spark read in place."""
    import pyarrow.parquet as pq

    target.mkdir()
    # a row per protein: its scores, not its maps (a residue pair's values each)
    scores = [name for name in emb.unlayered if name not in (contacts.NAME, attentions.NAME)]
    schema = parquet_schema(emb, options.kinds, scores)
    writer, written, files = None, 0, 0
    try:
        for block in blocks(emb, options.kinds, scores):
            table = parquet_table(block, schema)
            if writer is None or written >= PARQUET_FILE_BYTES:
                if writer is not None:
                    writer.close()
                writer = pq.ParquetWriter(target / f"part-{files:05d}.parquet", schema)
                written, files = 0, files + 1
            writer.write_table(table)
            written += table.nbytes
            bar.update(len(block.ids))
        if writer is None:  # no protein: the columns alone
            pq.write_table(schema.empty_table(), target / "part-00000.parquet")
    finally:
        if writer is not None:
            writer.close()


# What a copy of embeddings.h5 takes over as it is: everything but the values.
H5_AS_IS = ("ids", "headers", "lengths", "truncated", "sequence_sha256", "id_index",
            PER_TOK_OFFSETS, *(kind.offsets for kind in UNLAYERED.values() if kind.offsets))  # fmt: skip


def write_h5(emb, target, bar, options: Options):
    """embeddings.h5 with its values in the file, as `output_values: copy` writes it, from a
    copy or from one whose values are in place in the store: a file that needs no store."""
    with h5py.File(target, "w") as out:
        for name in H5_AS_IS:
            if name in emb.h5:
                out.require_group(str(Path(name).parent))
                emb.h5.copy(emb.h5[name], out, name=name)
        names = [
            dataset(kind, layer) for kind, layers in options.kinds.items() for layer in layers
        ]
        names += [KINDS[name].values for name in emb.unlayered]
        written = {}
        for name in names:
            values = emb.stored(name)
            out.create_dataset(name, values.shape, values.dtype)
            written[name] = 0
        for block in blocks(emb, options.kinds, emb.unlayered):
            parts = [
                (dataset(k, layer), v) for k, ls in block.values.items() for layer, v in ls.items()
            ]
            parts += [(KINDS[k].values, v) for k, (v, _) in block.unlayered.items()]
            for name, values in parts:
                out[name][written[name] : written[name] + len(values)] = values
                written[name] += len(values)
            bar.update(len(block.ids))
        out.attrs.update({k: v for k, v in emb.h5.attrs.items() if k != in_place.DATASETS})
        out.attrs.update(output_values="copy", per_residue_compression="none")


ANNDATA = {"encoding-type": "anndata", "encoding-version": "0.1.0"}


def _h5ad_group(parent, name: str, kind: str):
    """An AnnData element group: `dict` or `dataframe`."""
    group = parent.create_group(name)
    version = "0.2.0" if kind == "dataframe" else "0.1.0"
    group.attrs.update({"encoding-type": kind, "encoding-version": version})
    return group


def _h5ad_dataset(group, name: str, data=None, shape=None, dtype=None):
    """An AnnData array (`array` or, for text, `string-array`), whole or to be filled."""
    if dtype is None and data is not None and np.asarray(data).dtype.kind in "OUS":
        dtype = h5py.string_dtype("utf-8")
    out = group.create_dataset(name, data=data, shape=shape, dtype=dtype)
    text = h5py.check_string_dtype(out.dtype) is not None
    out.attrs.update({"encoding-type": "string-array" if text else "array",
                      "encoding-version": "0.2.0"})  # fmt: skip
    return out


def write_h5ad(emb, target, bar, options: Options):
    kinds = {k: layers for k, layers in emb.layers.items() if not KINDS[k].per_residue}
    scores = [name for name in emb.unlayered if KINDS[name].offsets is None]  # a row each: pll
    if not kinds and not scores:
        raise ExportError(
            "h5ad holds a row per protein, and this run has no per-protein values (mean, bos, "
            "pll): export its per-residue values as npy, parquet or pt"
        )
    n = len(emb)
    with h5py.File(target, "w") as out:
        out.attrs.update(ANNDATA)
        obs = _h5ad_group(out, "obs", "dataframe")
        columns = ["description", "length", "truncated", "sequence_sha256"]
        obs.attrs.update({"_index": "_index", "column-order": columns})
        index = _h5ad_dataset(obs, "_index", shape=(n,), dtype=h5py.string_dtype("utf-8"))
        # the FASTA header after the ID
        description = _h5ad_dataset(
            obs, "description", shape=(n,), dtype=h5py.string_dtype("utf-8")
        )
        _h5ad_dataset(obs, "length", emb.h5["lengths"][:].astype(np.int64))
        _h5ad_dataset(obs, "truncated", emb.h5["truncated"][:].astype(bool))
        _h5ad_dataset(obs, "sequence_sha256", emb.h5["sequence_sha256"].asstr()[:])
        var = _h5ad_group(out, "var", "dataframe")
        var.attrs.update({"_index": "_index", "column-order": np.array([], dtype=np.float64)})
        _h5ad_dataset(var, "_index", np.array([], dtype=object))
        obsm = _h5ad_group(out, "obsm", "dict")
        targets = {}
        for kind, layers in kinds.items():
            for layer in layers:
                data = emb.stored(dataset(kind, layer))
                targets[(kind, layer)] = _h5ad_dataset(
                    obsm, f"{kind}_{layer}", shape=data.shape, dtype=data.dtype
                )
        for name in scores:
            data = emb.stored(KINDS[name].values)
            targets[name] = _h5ad_dataset(obsm, name, shape=data.shape, dtype=data.dtype)
        for name in ("layers", "obsp", "varm", "varp"):
            _h5ad_group(out, name, "dict")
        uns = _h5ad_group(_h5ad_group(out, "uns", "dict"), "esmshard", "dict")
        for key, value in emb.made_by.items():  # numbers as numbers, else text (or JSON text)
            if isinstance(value, (int, float)):
                uns.create_dataset(key, data=value)
                encoding = "numeric-scalar"
            else:
                text = value if isinstance(value, str) else json.dumps(value)
                uns.create_dataset(key, data=text, dtype=h5py.string_dtype("utf-8"))
                encoding = "string"
            uns[key].attrs.update({"encoding-type": encoding, "encoding-version": "0.2.0"})
        for block in blocks(emb, kinds, scores):
            rows = slice(block.start, block.start + len(block.ids))
            index[rows] = block.ids
            description[rows] = [h[len(i) :].lstrip() for i, h in zip(block.ids, block.headers)]
            for kind, layers in block.values.items():
                for layer, values in layers.items():
                    targets[(kind, layer)][rows] = values
            for name, (values, _) in block.unlayered.items():
                targets[name][rows] = values
            bar.update(len(block.ids))


class Format(NamedTuple):
    name: str
    write: object  # (emb: Embeddings, target: Path, bar: ProgressBar, options: Options) -> None
    folder: bool  # the output is a folder of files
    options: tuple[str, ...] = ()  # the options of `export` it reads; the others are refused


FORMATS = {
    f.name: f
    for f in (
        Format("per-protein-h5", write_per_protein_h5, False, ("kind", "layer", "key")),
        Format("pt", write_pt, True, ("names",)),
        Format("npy", write_npy, True),
        Format("parquet", write_parquet, True),
        Format("h5", write_h5, False),
        Format("h5ad", write_h5ad, False),
        Format("biotrainer", write_biotrainer, True, ("layer",)),
    )
}


def option_problem(fmt: str, given: dict) -> str | None:
    """Why options given to `export` (name -> value; None: not given) do not fit `fmt`."""
    wrong = [name for name, value in given.items() if value is not None]
    wrong = [name for name in wrong if name not in FORMATS[fmt].options]
    if not wrong:
        return None
    takes = {f"--{n}": [f.name for f in FORMATS.values() if n in f.options] for n in wrong}
    return "; ".join(
        f"{option} applies to --format {' and '.join(formats)} only, not {fmt}: leave it out"
        for option, formats in takes.items()
    )


def export(
    outdir,
    fmt: str,
    out,
    *,
    kind: str | None = None,
    layer=None,
    key=None,
    names=None,
    stream=sys.stderr,
) -> int:
    """Write the run in `outdir` as `fmt` to `out` (a new file or folder, which appears whole
    once written); returns the number of proteins. `kind` and `layer` choose per-protein-h5's
    one dataset per protein (default: mean, else the first kind held; the highest layer), `key`
    its names (default "hash"); `names` pt's file names (default "id"). An option `fmt` does not
    read is refused."""
    problem = option_problem(fmt, {"kind": kind, "layer": layer, "key": key, "names": names})
    if problem:
        raise ExportError(problem)
    layout = Layout(str(outdir))
    out = Path(out)
    if out.is_symlink() and not out.exists():
        raise ExportError(f"{out} is a link to {os.readlink(out)}, which does not exist; "
                          "remove the link or choose another --out")  # fmt: skip
    if out.exists():
        raise ExportError(f"{out} exists; remove it or choose another --out")
    if not out.parent.is_dir():
        raise ExportError(f"{out.parent} is not a folder; make it, or choose another --out")
    problem = unwritable(out.parent)
    if problem:
        raise ExportError(f"{problem}; choose another --out")
    if not Path(layout.embeddings).exists():
        raise ExportError(f"{layout.embeddings} does not exist: give the outdir of a finished run")
    sequences_needed = fmt == "biotrainer" or fmt == "per-protein-h5" and (key or "hash") == "hash"
    if sequences_needed and not Path(layout.records).is_file():
        needs = "biotrainer's sequences.fasta" if fmt == "biotrainer" else "--key hash"
        raise ExportError(
            f"{outdir} holds no record table of its run ({layout.records}), whose input files "
            f"give the sequences that {needs} needs (a saved esmshard.embed result has none): "
            "export from the run's outdir"
            + ("" if fmt == "biotrainer" else ", or name the proteins with --key id")
        )
    with Embeddings(layout.embeddings) as emb:
        kinds = emb.layers
        if fmt == "per-protein-h5":
            if not emb.layers:
                raise ExportError(
                    f"{layout.embeddings} holds no representations (include: contact maps or "
                    "scores only), and per-protein-h5 holds one: export as pt, npy or parquet"
                )
            chosen = kind or ("mean" if "mean" in emb.layers else next(iter(emb.layers)))
            kinds = {chosen: [emb.layer(chosen, layer)]}
        if fmt == "biotrainer":
            kinds = {k: [emb.layer(k, layer)] for k in BIOTRAINER_FILES if k in emb.layers}
            if not kinds:
                raise ExportError(
                    f"{layout.embeddings} holds neither mean nor per_tok, the representations "
                    "biotrainer trains on: run with include: [mean] or [per_tok]"
                )
        bar = ProgressBar(len(emb), f"export {fmt}", stream)
        remove_dead_temporaries_of(out)  # of an export killed before
        try:
            with atomic_path(out, replace=False) as target:
                # the run's relative input paths start where it ran (run.json's workdir)
                workdir = (read_json_object(Path(layout.run_json)) or {}).get("workdir")
                options = Options(kinds, key or "hash", layout.records, names or "id",
                                  workdir or ".")  # fmt: skip
                FORMATS[fmt].write(emb, Path(target), bar, options)
        except FileExistsError as err:
            if err.filename != str(out):
                raise
            raise ExportError(
                f"{out} appeared while this export ran (another export or program wrote it): "
                "it is left as it is, and this export is not kept; choose another --out"
            ) from None
        return len(emb)
