"""What an embedding holds: the representation kinds and fair-esm's layer numbering.

`KINDS` is the one table of representation kinds: the shard writer, merge and the config schema
all follow it, so a new kind is one entry here. Contact maps (esmshard.contacts) are not a kind:
one per sequence, not per layer.
"""

from dataclasses import dataclass
from typing import Callable, NamedTuple

import numpy as np


class Representation(NamedTuple):
    """One sequence at one layer, float32."""

    per_tok: np.ndarray  # residues × D, BOS and EOS excluded
    bos: np.ndarray  # D: the BOS token's representation
    # The sequence's contact map (esmshard.contacts' triangle), the same at every layer; None
    # unless `include` asks for contacts.
    contacts: np.ndarray | None = None


@dataclass(frozen=True)
class Kind:
    name: str
    per_residue: (
        bool  # one row per residue (records concatenated, with offsets), else one per record
    )
    rows: Callable[[list[Representation]], np.ndarray]  # the rows of a batch of sequences


KINDS = {
    k.name: k
    for k in (
        Kind("mean", False, lambda reps: np.stack([r.per_tok.mean(0) for r in reps])),
        Kind("per_tok", True, lambda reps: np.concatenate([r.per_tok for r in reps])),
        Kind("bos", False, lambda reps: np.stack([r.bos for r in reps])),
    )
}


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
