"""What an embedding holds: the one table of kinds (KINDS) and fair-esm's layer numbering.

`KINDS` is the one table of what `include` names and embeddings.h5, shard files and pieces hold:
the shard writer, merge, the reader, export and the config schema all follow it, so a new kind
is one entry here. A layered kind (`mean`, `per_tok`, `bos`) is stored per layer, one dataset
`<kind>/<layer>` of D columns each; an unlayered one (contact maps, language-model scores,
attention maps) once per protein, in one dataset `<kind>/values`, with `<kind>/offsets` in
embeddings.h5 where a protein has several rows (N + 1 values: where each one's start).
"""

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from . import attentions, contacts, scores

# What a kind holds per protein: one row, one per residue, its contact map's triangle
# (esmshard.embeddings_h5.contacts: L(L+1)/2 values), or one per pair of residues (L², its
# attention maps: esmshard.embeddings_h5.attentions).
PROTEIN, RESIDUE, TRIANGLE, SQUARE = "protein", "residue", "triangle", "square"


class Representation(NamedTuple):
    """One sequence at one layer, float32; a kind that was not read back is None. The unlayered
    kinds are the same at every layer."""

    length: int  # residues embedded
    per_tok: np.ndarray | None = None  # residues × D, BOS and EOS excluded
    mean: np.ndarray | None = None  # D: the mean over the residues (BOS, EOS, padding excluded)
    bos: np.ndarray | None = None  # D: the BOS token's representation
    contacts: np.ndarray | None = None  # esmshard.embeddings_h5.contacts' triangle
    logits: np.ndarray | None = None  # residues × 20 (scores.AMINO_ACIDS), one pass
    masked_marginals: np.ndarray | None = None  # residues × 20, each residue masked
    pll: np.ndarray | None = None  # 2: the pseudo-log-likelihood and its mean per residue
    attentions: np.ndarray | None = None  # L² × layers·heads (esmshard.embeddings_h5.attentions)

    @classmethod
    def from_per_tok(cls, per_tok: np.ndarray, bos: np.ndarray):
        """Every layered kind from the per-residue rows, the mean taken on the host in fp32."""
        return cls(len(per_tok), per_tok, per_tok.mean(0, dtype=np.float32), bos)


@dataclass(frozen=True)
class Kind:
    name: str  # the `include` value, the HDF5 group and the Representation field
    rows: str  # PROTEIN, RESIDUE, TRIANGLE or SQUARE
    layered: bool = True  # `<kind>/<layer>` per layer (D columns), else `<kind>/values`
    # an unlayered kind's columns (none: a value per row, or as many as the run's settings make:
    # `widths` of the shard writer)
    columns: tuple[str, ...] = ()
    title: str = ""  # as a sentence names it

    @property
    def per_residue(self) -> bool:
        return self.rows == RESIDUE

    @property
    def values(self) -> str:
        """An unlayered kind's one dataset."""
        return f"{self.name}/values"

    @property
    def offsets(self) -> str | None:
        """embeddings.h5's dataset of where each protein's rows start, where it has several."""
        if self.rows == PROTEIN:
            return None
        return PER_TOK_OFFSETS if self.layered else f"{self.name}/offsets"

    def row_counts(self, lengths) -> np.ndarray:
        """The rows that proteins of `lengths` residues hold each."""
        lengths = np.asarray(lengths, dtype=np.int64)
        if self.rows == TRIANGLE:
            return contacts.triangle_size(lengths)
        if self.rows == SQUARE:
            return lengths * lengths
        return lengths if self.rows == RESIDUE else np.ones(lengths.size, dtype=np.int64)

    def starts(self, lengths) -> np.ndarray:
        """Where each protein's rows start, one after the other, and the total at the end."""
        out = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(self.row_counts(lengths), out=out[1:])
        return out

    def rows_of(self, reps: list[Representation]) -> np.ndarray:
        """The rows of a batch of sequences."""
        values = [getattr(r, self.name) for r in reps]
        return np.stack(values) if self.rows == PROTEIN else np.concatenate(values)


KINDS = {
    k.name: k
    for k in (
        Kind("mean", PROTEIN, title="mean representations"),
        Kind("per_tok", RESIDUE, title="per-residue representations"),
        Kind("bos", PROTEIN, title="BOS representations"),
        Kind(contacts.NAME, TRIANGLE, layered=False, title="contact maps"),
        Kind(scores.LOGITS, RESIDUE, False, scores.AMINO_ACIDS, "logits"),
        Kind(scores.MASKED_MARGINALS, RESIDUE, False, scores.AMINO_ACIDS, "masked marginals"),
        Kind(scores.PLL, PROTEIN, False, scores.PLL_COLUMNS, "pseudo-log-likelihoods"),
        Kind(attentions.NAME, SQUARE, layered=False, title="attention maps"),
    )
}
LAYERED = {name: kind for name, kind in KINDS.items() if kind.layered}
UNLAYERED = {name: kind for name, kind in KINDS.items() if not kind.layered}
# embeddings.h5 alone: where each record's per-residue rows start (N + 1 values).
PER_TOK_OFFSETS = "per_tok/offsets"


def kind_of(dataset: str) -> Kind:
    """The kind of a dataset of values (`mean/33`, `logits/values`)."""
    return KINDS[dataset.split("/")[0]]


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
