"""The shard file: one shard's embeddings in HDF5, as embed jobs write it into the store and
merge reads it.

Layout: `sequence_sha256` (the key of each row's sequence, hex), `ids` (the first record with
that sequence in the run that computed it), `length` (residues embedded), one dataset
`<kind>/<layer>` per layered kind and layer (rows in processing order; per-residue kinds
concatenated), `<kind>/values` per unlayered kind included (contact triangles, scores:
esmshard.embeddings_h5.representations.KINDS; each row's values, concatenated), `failed/sequence_sha256`, `failed/ids`, `failed/reason`, and attributes: the
shard's name, the precision and device it ran with, and `settings`, the JSON of the embedding
settings (esmshard.config.embedding_settings) that merge checks.
"""

from typing import NamedTuple

import h5py
import numpy as np

from ..embeddings_h5.representations import KINDS, LAYERED, Representation
from . import keys_of

STR_DTYPE = h5py.string_dtype("utf-8")
SHA256_DTYPE = np.dtype("S64")  # hex digests, fixed-length ASCII


class Failure(NamedTuple):
    index: int  # the sequence's position in its shard
    reason: str


def write_strings(h5, name: str, values) -> None:
    """A UTF-8 string dataset, as every text column of esmshard's HDF5 files is stored."""
    h5.create_dataset(name, data=np.array(values, dtype=object), dtype=STR_DTYPE)


def output_bytes(lengths, n_layers: int, include, dim: int, widths=None) -> int:
    """About the size of a file of these embeddings (sequences of `lengths` residues): float32
    values, plus 1 MB for the rest."""
    values = 0
    for kind in (KINDS[name] for name in include):
        rows = int(kind.row_counts(lengths).sum())
        values += rows * (
            n_layers * dim if kind.layered else int(np.prod(value_width(kind, widths)))
        )
    return 4 * values + (1 << 20)


def value_width(kind, widths=None) -> tuple[int, ...]:
    """An unlayered kind's row shape: its columns, or the width the run's settings make it
    (`widths`: the attention maps', esmshard.embeddings_h5.attentions.Asked.width), or one
    value."""
    if kind.columns:
        return (len(kind.columns),)
    width = (widths or {}).get(kind.name)
    return (width,) if width else ()


def create_values(h5, kind, dim: int, layers, widths=None) -> None:
    """The growable datasets of `kind` in a new shard file: one per layer, or its one."""
    if not kind.layered:
        width = value_width(kind, widths)
        h5.create_dataset(
            kind.values, (0, *width), np.float32, maxshape=(None, *width), chunks=True
        )
        return
    for layer in layers:
        h5.create_dataset(
            dataset(kind.name, layer), (0, dim), np.float32, maxshape=(None, dim), chunks=True
        )


def dataset(kind: str, layer: int) -> str:
    return f"{kind}/{layer}"


class ShardWriter:
    """Appends batches to an open shard file."""

    def __init__(self, h5: h5py.File, layers, include, dim, widths=None):
        self.h5 = h5
        self.kinds = [KINDS[name] for name in include]
        columns = (("sequence_sha256", SHA256_DTYPE), ("length", np.int64), ("ids", STR_DTYPE))
        for name, dtype in columns:
            h5.create_dataset(name, (0,), dtype=dtype, maxshape=(None,), chunks=True)
        for kind in self.kinds:
            create_values(h5, kind, dim, layers, widths)

    @staticmethod
    def _append(dset, rows: np.ndarray):
        start = dset.shape[0]
        dset.resize(start + len(rows), axis=0)
        dset[start:] = rows

    def write(self, keys, ids, reps: list[dict[int, Representation]]):
        self._append(self.h5["sequence_sha256"], np.asarray(keys, dtype=SHA256_DTYPE))
        self._append(self.h5["ids"], np.asarray(ids, dtype=object))
        lengths = [next(iter(r.values())).length for r in reps]
        self._append(self.h5["length"], np.asarray(lengths, dtype=np.int64))
        layer = next(iter(reps[0]))
        for kind in self.kinds:
            if not kind.layered:  # the same at every layer
                self._append(self.h5[kind.values], kind.rows_of([r[layer] for r in reps]))
                continue
            for layer in reps[0]:
                at_layer = [r[layer] for r in reps]
                self._append(self.h5[dataset(kind.name, layer)], kind.rows_of(at_layer))

    def write_failed(self, failed: list[Failure], keys: list[str], ids: list[str]):
        """The failed sequences, by their position in the shard's `keys` and `ids`."""
        failed = sorted(failed)
        h5 = self.h5
        failed_keys = np.array([keys[f.index] for f in failed], dtype=SHA256_DTYPE)
        h5.create_dataset("failed/sequence_sha256", data=failed_keys, dtype=SHA256_DTYPE)
        write_strings(h5, "failed/ids", [ids[f.index] for f in failed])
        write_strings(h5, "failed/reason", [f.reason for f in failed])


class ShardIndex(NamedTuple):
    """What merge reads of a shard file before copying its representations."""

    attrs: dict
    keys: np.ndarray  # KEY_DTYPE (esmshard.store), one per row
    lengths: np.ndarray
    failed_keys: np.ndarray  # KEY_DTYPE, one per failed sequence
    failed_reasons: list[str]
    layers: dict[str, list[int]]  # layered kind -> layers


def read_index(h5: h5py.File) -> ShardIndex:
    """The shard file's small datasets; a group that is no kind of KINDS is refused."""
    groups = {name for name in h5 if isinstance(h5[name], h5py.Group)} - {"failed"}
    unknown = groups - set(KINDS)
    if unknown:
        raise KeyError(f"unknown representation kind(s) {sorted(unknown)}")
    return ShardIndex(
        attrs=dict(h5.attrs),
        keys=keys_of(h5["sequence_sha256"][:]),
        lengths=h5["length"][:],
        failed_keys=keys_of(h5["failed/sequence_sha256"][:]),
        failed_reasons=h5["failed/reason"].asstr()[:].tolist(),
        layers={kind: sorted(int(layer) for layer in h5[kind]) for kind in LAYERED if kind in h5},
    )
