"""Attention maps as esmshard keeps them: per protein, the layers `attention_layers` names, each
head's map (`attention_heads: all`) or their mean (`mean`), residues only (BOS and EOS left out).

A protein of L residues has L² rows in `attentions/values`, one per (query, key) pair in
row-major order, each with a column per layer and head (layer-major: the first layer's heads,
then the next layer's); the proteins' rows are concatenated, `attentions/offsets` says where each
starts. The maps are fair-esm's attention weights (`need_head_weights`): each query's row sums
to 1 over every token of the sequence, BOS and EOS included, so a map's rows here sum to less.
"""

from typing import NamedTuple

import numpy as np

NAME = "attentions"  # the `include` value, and the HDF5 group


class Asked(NamedTuple):
    """The maps a run keeps: its layers (absolute, 1 to the model's layers) and heads."""

    layers: list[int]
    heads: str  # `attention_heads`: "mean" or "all"

    def width(self, model_heads: int) -> int:
        """Values per (query, key) pair."""
        return len(self.layers) * (model_heads if self.heads == "all" else 1)


def rows(maps: np.ndarray) -> np.ndarray:
    """One protein's maps (layers × heads × L × L) as its rows (L² × layers·heads)."""
    layers, heads, length, _ = maps.shape
    return maps.transpose(2, 3, 0, 1).reshape(length * length, layers * heads)


def maps(values: np.ndarray, length: int, layers: int) -> np.ndarray:
    """The rows of one protein back as its maps: layers × heads × L × L."""
    heads = values.shape[1] // layers
    return values.reshape(length, length, layers, heads).transpose(2, 3, 0, 1)


def layer_problems(attention_layers, num_layers: int, model: str) -> list[str]:
    """A line for each of `attention_layers` that is no layer of attention (fair-esm's numbering:
    1 to `num_layers`, negative from the end; 0, the embeddings, has none)."""
    return [
        f"attention_layers: layer {layer} has no attention maps in {model}, which has "
        f"{num_layers} layers; give 1 to {num_layers}, or -1 (the last) to -{num_layers}"
        for layer in attention_layers
        if not (1 <= layer <= num_layers or -num_layers <= layer <= -1)
    ]
