"""A per-protein HDF5 written outside a run, read as a search's reference: UniProt's and EAT's
(one dataset per protein, named by its accession) and `esmshard export --format per-protein-h5`'s
(named by ID or by sequence hash, the record's ID in each dataset's `original_id`).

Such a file holds one vector per protein and, but for esmshard's export, says nothing of the
model or the layer that made it: the search checks its width alone, and says so.
"""

from functools import cached_property
from pathlib import Path

import h5py
import numpy as np

from ..files import DamagedFileError
from .reader import Embeddings, embeddings_file


class PerProteinRows:
    """The file's vectors as rows of one matrix, read by slices of rows (as an HDF5 dataset)."""

    def __init__(self, h5: h5py.File, names: list[str], dim: int):
        self.h5, self.names, self.shape = h5, names, (len(names), dim)

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, rows: slice) -> np.ndarray:
        names = self.names[rows]
        block = np.empty((len(names), self.shape[1]), dtype=np.float32)
        for i, name in enumerate(names):
            values = self.h5[name]
            if not isinstance(values, h5py.Dataset) or values.shape != (self.shape[1],):
                raise ValueError(
                    f"{self.h5.filename}: {name!r} holds {getattr(values, 'shape', 'no')} "
                    f"values, not a vector of {self.shape[1]} as the file's first: one vector "
                    "per protein is needed"
                )
            block[i] = values[()]
        return block


class PerProteinFile:
    """An open per-protein HDF5, as the search reads a reference: its IDs, width, vectors and,
    where esmshard's export wrote it, what made them. Use as a context manager."""

    def __init__(self, path):
        self.path, self.name = Path(path), str(path)
        self.h5 = h5py.File(path, "r")
        # the first member alone, as the check with the config reads it before every job: a
        # reference of a million proteins is not listed then
        first = self.h5.get(next(iter(self.h5), ""))
        if not isinstance(first, h5py.Dataset):
            self.h5.close()
            raise DamagedFileError(f"{path} is an HDF5 file without embeddings: not a run's "
                                   "embeddings.h5, nor one dataset per protein")  # fmt: skip
        self.dim = int(first.shape[-1])
        self.made_by = dict(self.h5.attrs)
        self.layers = None  # not known: the search compares whatever the file holds

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.h5.close()

    def __len__(self) -> int:
        return len(self.h5)

    @cached_property
    def names(self) -> list[str]:
        """The datasets' names, in the file's order: a protein each."""
        return list(self.h5)

    def ids(self) -> list[str]:
        """Each dataset's `original_id` (esmshard's and biotrainer's files), else its name."""
        return [str(self.h5[name].attrs.get("original_id", name)) for name in self.names]

    def stored(self, name: str) -> PerProteinRows:
        """The vectors, whatever the layer named (the file holds one)."""
        return PerProteinRows(self.h5, self.names, self.dim)


def open_reference(path) -> "Embeddings | PerProteinFile":
    """A search's reference: a run's embeddings.h5 (or its outdir), or a per-protein HDF5."""
    file = embeddings_file(path)
    try:
        with h5py.File(file, "r") as h5:
            per_protein = "ids" not in h5
    except OSError:
        per_protein = False  # Embeddings says what the file is
    return PerProteinFile(file) if per_protein else Embeddings(file)


def unrecorded_line(reference) -> str | None:
    """The line that says a reference's model was not checked (a per-protein file that does not
    name it), or None."""
    if reference.layers is not None or "model" in reference.made_by:
        return None
    return (
        f"{reference.name} does not say which model or layer made it: only its width "
        f"({reference.dim}) was checked; search it with embeddings of the model that made it"
    )
