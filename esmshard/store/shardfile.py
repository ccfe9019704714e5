"""The shard file: one shard's embeddings in HDF5, as embed jobs write it into the store and
merge reads it.

Layout: `sequence_sha256` (the key of each row's sequence, hex), `ids` (the first record with
that sequence in the run that computed it), `length` (residues embedded), one dataset
`<kind>/<layer>` per representation kind and layer (rows in processing order; per-residue kinds
concatenated), `contacts/values` when contacts are included (esmshard.contacts: each row's
triangle, concatenated), `failed/sequence_sha256`, `failed/ids`, `failed/reason`, and attributes: the
shard's name, the precision and device it ran with, and `settings`, the JSON of the embedding
settings (esmshard.config.embedding_settings) that merge checks.
"""

from typing import NamedTuple

import h5py
import numpy as np

from .. import contacts
from ..contacts import CONTACT_VALUES
from ..representations import KINDS, Representation
from . import keys_of

STR_DTYPE = h5py.string_dtype("utf-8")
SHA256_DTYPE = np.dtype("S64")  # hex digests, fixed-length ASCII


class Failure(NamedTuple):
    index: int  # the sequence's position in its shard
    reason: str


def write_strings(h5, name: str, values) -> None:
    """A UTF-8 string dataset, as every text column of esmshard's HDF5 files is stored."""
    h5.create_dataset(name, data=np.array(values, dtype=object), dtype=STR_DTYPE)


def output_bytes(
    n_records: int, n_residues: int, n_layers: int, include, dim: int, contact_values: int = 0
) -> int:
    """About the size of a file of these embeddings: float32 rows and contact values, plus 1 MB
    for the rest."""
    rows = sum(
        n_residues if KINDS[kind].per_residue else n_records for kind in include if kind in KINDS
    )
    return 4 * (rows * n_layers * dim + contact_values) + (1 << 20)


def dataset(kind: str, layer: int) -> str:
    return f"{kind}/{layer}"


class ShardWriter:
    """Appends batches to an open shard file."""

    def __init__(self, h5: h5py.File, layers, include, dim):
        self.h5 = h5
        self.kinds = [kind for kind in include if kind in KINDS]
        self.contacts = contacts.NAME in include
        if self.contacts:
            h5.create_dataset(CONTACT_VALUES, (0,), np.float32, maxshape=(None,), chunks=True)
        columns = (("sequence_sha256", SHA256_DTYPE), ("length", np.int64), ("ids", STR_DTYPE))
        for name, dtype in columns:
            h5.create_dataset(name, (0,), dtype=dtype, maxshape=(None,), chunks=True)
        for kind in self.kinds:
            for layer in layers:
                h5.create_dataset(
                    dataset(kind, layer), (0, dim), np.float32, maxshape=(None, dim), chunks=True
                )

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
        for layer in reps[0]:
            at_layer = [r[layer] for r in reps]
            for kind in self.kinds:
                self._append(self.h5[dataset(kind, layer)], KINDS[kind].rows(at_layer))
        if self.contacts:
            triangles = [next(iter(r.values())).contacts for r in reps]
            self._append(self.h5[CONTACT_VALUES], np.concatenate(triangles))

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
    layers: dict[str, list[int]]  # representation kind -> layers


def read_index(h5: h5py.File) -> ShardIndex:
    """The shard file's small datasets; a group that is no representation kind is refused."""
    groups = {name for name in h5 if isinstance(h5[name], h5py.Group)} - {"failed", contacts.NAME}
    unknown = groups - set(KINDS)
    if unknown:
        raise KeyError(f"unknown representation kind(s) {sorted(unknown)}")
    return ShardIndex(
        attrs=dict(h5.attrs),
        keys=keys_of(h5["sequence_sha256"][:]),
        lengths=h5["length"][:],
        failed_keys=keys_of(h5["failed/sequence_sha256"][:]),
        failed_reasons=h5["failed/reason"].asstr()[:].tolist(),
        layers={kind: sorted(int(layer) for layer in h5[kind]) for kind in KINDS if kind in h5},
    )
