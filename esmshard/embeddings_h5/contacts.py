"""Contact maps as esmshard keeps them: each sequence's upper triangle, diagonal included.

fair-esm's contact head gives an L × L matrix per sequence that is symmetric (it symmetrises the
attention maps before its regression), so the L(L+1)/2 values on and above the diagonal hold all
of it: row by row, `numpy.triu_indices(L)` order. The triangles of a file's sequences are
concatenated in one dataset, `contacts/values`; in embeddings.h5 `contacts/offsets` (N + 1
values, esmshard.embeddings_h5.representations.Kind.starts) says where each one starts, in shard
files their lengths do.
"""

import numpy as np

NAME = "contacts"  # the `include` value, and the HDF5 group
CONTACT_VALUES = f"{NAME}/values"
# embeddings.h5 alone: where each record's triangle starts (N + 1 values).
CONTACT_OFFSETS = f"{NAME}/offsets"
# The type of the contact maps in embeddings.h5 (the store keeps float32): float16 halves them.
DTYPES = {"float16": np.float16, "float32": np.float32}


def triangle_size(length):
    """Values kept for a sequence of `length` residues (works on arrays too)."""
    return length * (length + 1) // 2


def upper_triangle(matrix: np.ndarray) -> np.ndarray:
    return matrix[np.triu_indices(matrix.shape[0])]


def full_matrix(values: np.ndarray, length: int) -> np.ndarray:
    """The L × L map back from its triangle."""
    matrix = np.zeros((length, length), dtype=values.dtype)
    rows, columns = np.triu_indices(length)
    matrix[rows, columns] = values
    matrix[columns, rows] = values
    return matrix
