"""Every single substitution of every record (`variants: all`), named and scored in blocks."""

from typing import NamedTuple

import numpy as np

from ..embeddings_h5.scores import AMINO_ACIDS, COLUMN, residue_columns
from ..input.fasta import read_raw
from ..input.variants import PSEUDO_PPL
from ..outputs.variant_writer import ROWS_PER_GROUP, ScoreWriter
from .variant_strategies import Matrices, differences, relative_plls

# Each wild type's 19 substitutions: the other amino acids' columns, in order.
OTHERS = np.array([[a for a in range(len(COLUMN)) if a != wild] for wild in range(len(COLUMN))])


class Substitutions(NamedTuple):
    """Every single substitution of one protein, position-major, the amino acids in order."""

    id: str
    positions: np.ndarray  # 0-based
    wild: np.ndarray  # the wild type's column (esmshard.embeddings_h5.scores.AMINO_ACIDS)
    mutant: np.ndarray  # the mutant's column
    scores: dict[str, np.ndarray]

    @classmethod
    def of(cls, id_: str, sequence: bytes) -> "Substitutions":
        """Those of `sequence`; positions holding X and the like have none (as
        esmshard.input.variants.single_substitutions)."""
        columns = residue_columns(sequence)
        at = np.flatnonzero(columns >= 0)
        positions = np.repeat(at, len(COLUMN) - 1)
        return cls(id_, positions, columns[positions], OTHERS[columns[at]].ravel(), {})


def substitution_names(positions: np.ndarray, wild: np.ndarray, mutant: np.ndarray, offset: int):
    """esmshard.input.variants.substitution_name of many substitutions at once, as a pyarrow
    string array: 0-based `positions` (those of one residue next to each other, of one wild
    type), the amino acids by their columns. Each residue's part (`H24`) is made once."""
    import pyarrow as pa
    import pyarrow.compute as pc

    def letters(columns):
        return pa.DictionaryArray.from_arrays(columns.astype(np.int8), pa.array(AMINO_ACIDS))

    starts = np.flatnonzero(np.diff(positions, prepend=-1))
    residues = pc.binary_join_element_wise(
        letters(wild[starts]).cast(pa.string()),
        pc.cast(pa.array(positions[starts] + offset), pa.string()),
        "",
    )
    residue_of = np.repeat(np.arange(len(starts)), np.diff(starts, append=len(positions)))
    return pc.binary_join_element_wise(
        residues.take(residue_of), letters(mutant).cast(pa.string()), ""
    )


def _write_substitutions(writer: ScoreWriter, block: list[Substitutions], offset: int) -> None:
    """Proteins' substitutions as rows of `id` (a dictionary of the block's IDs) and `mutant`,
    and their scores."""
    import pyarrow as pa

    counts = [len(s.positions) for s in block]
    ids = pa.DictionaryArray.from_arrays(
        np.repeat(np.arange(len(block), dtype=np.int32), counts), pa.array([s.id for s in block])
    )
    names = substitution_names(
        *(
            np.concatenate([getattr(s, field) for s in block])
            for field in ("positions", "wild", "mutant")
        ),
        offset,
    )
    scores = {name: np.concatenate([s.scores[name] for s in block]) for name in writer.strategies}
    writer.write([ids, names], scores)


def all_substitutions(emb, inputs, strategies, plls, writer: ScoreWriter, offset: int) -> int:
    """Every single substitution of every embedded record, the records in order of their IDs
    (one protein's rows in a few row groups of the Parquet dataset, found by their statistics),
    named with its residues numbered from `offset`; the records not embedded (failed) counted.
    The rows are written a block of about ROWS_PER_GROUP at a time, built by array operations:
    a proteome's tens of millions of rows in seconds."""
    missing = 0
    lengths = emb.h5["lengths"][:]
    row_of = {id_: row for row, id_ in enumerate(emb.ids())}
    matrices = Matrices(emb, strategies)
    records = {r.id: r.sequence for path in inputs for r in read_raw(str(path))}
    block, held = [], 0
    for id_ in sorted(records):
        row = row_of.get(id_)
        if row is None:
            missing += 1
            continue
        found = Substitutions.of(id_, records.pop(id_)[: int(lengths[row])])
        for name, matrix in matrices.of(row).items():
            found.scores[name] = differences(matrix, found.positions, found.wild, found.mutant)
        if PSEUDO_PPL in strategies:
            names = substitution_names(found.positions, found.wild, found.mutant, offset)
            found.scores.update(relative_plls(id_, names.to_pylist(), plls))
        block.append(found)
        held += len(found.positions)
        if held >= ROWS_PER_GROUP:
            _write_substitutions(writer, block, offset)
            block, held = [], 0
            matrices.release()
    if block:
        _write_substitutions(writer, block, offset)
    return missing
