"""What an embedding holds: the representation kinds and fair-esm's layer numbering.

`KINDS` is the one table of representation kinds: the shard writer, merge and the config schema
all follow it, so a new kind is one entry here. Contact maps (esmshard.contacts) are not a kind:
one per sequence, not per layer.
"""

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np


class Representation(NamedTuple):
    """One sequence at one layer, float32; a kind that was not read back is None."""

    length: int  # residues embedded
    per_tok: np.ndarray | None = None  # residues × D, BOS and EOS excluded
    mean: np.ndarray | None = None  # D: the mean over the residues (BOS, EOS, padding excluded)
    bos: np.ndarray | None = None  # D: the BOS token's representation
    # The sequence's contact map (esmshard.contacts' triangle), the same at every layer; None
    # unless `include` asks for contacts.
    contacts: np.ndarray | None = None

    @classmethod
    def from_per_tok(cls, per_tok: np.ndarray, bos: np.ndarray, contacts=None):
        """Every kind from the per-residue rows, the mean taken on the host in fp32."""
        return cls(len(per_tok), per_tok, per_tok.mean(0, dtype=np.float32), bos, contacts)


@dataclass(frozen=True)
class Kind:
    name: str  # also the Representation field that holds it
    per_residue: (
        bool  # one row per residue (records concatenated, with offsets), else one per record
    )

    def rows(self, reps: list[Representation]) -> np.ndarray:
        """The rows of a batch of sequences."""
        values = [getattr(r, self.name) for r in reps]
        return np.concatenate(values) if self.per_residue else np.stack(values)


KINDS = {k.name: k for k in (Kind("mean", False), Kind("per_tok", True), Kind("bos", False))}
# embeddings.h5 alone: where each record's per-residue rows start (N + 1 values).
PER_TOK_OFFSETS = "per_tok/offsets"


def absolute_layers(repr_layers, num_layers: int) -> list[int]:
    """fair-esm's convention: negative layers count from the end; 0 is the embedding layer."""
    layers = []
    for layer in repr_layers:
        if not -(num_layers + 1) <= layer <= num_layers:
            raise ValueError(
                f"repr_layers: layer {layer} does not exist in a {num_layers}-layer model"
            )
        layers.append((layer + num_layers + 1) % (num_layers + 1))
    return sorted(set(layers))


def narrowed(values: np.ndarray, dtype, where: str) -> np.ndarray:
    """`values` as `dtype` (output_dtype, contacts_dtype), refusing values that it cannot hold
    rather than giving infinities; `where` names them in the error."""
    dtype = np.dtype(dtype)
    if values.dtype == dtype:
        return values
    largest = float(np.abs(values).max()) if values.size else 0.0
    if largest > float(np.finfo(dtype).max):
        raise ValueError(
            f"{where} holds values up to {largest:g}, more than {dtype.name} holds "
            f"({np.finfo(dtype).max:g}); set output_dtype: float32"
        )
    return values.astype(dtype)
