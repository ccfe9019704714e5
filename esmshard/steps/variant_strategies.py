"""The variant-scoring strategies' arithmetic, over a protein's logits and masked marginals."""

from collections import defaultdict

import numpy as np

from ..embeddings_h5.scores import COLUMN, LOGITS, PLL, residue_columns
from ..input.changes import one_pass_pll
from ..input.variants import (
    PLLR,
    PSEUDO_PPL,
    STRATEGIES,
    WILD_TYPE_PLL,
    change_of,
    mutant_id,
    pllr_sequences,
    score_columns,
    wild_type_id,
)
from ..outputs.reader import Embeddings


class Matrices:
    """Each strategy's log-probabilities of a protein (residues × 20), a protein at a time, as
    slices of the file's one array per kind (Embeddings.slices)."""

    def __init__(self, emb: Embeddings, strategies):
        self.sources = {
            name: emb.slices(kind) for name, kind in STRATEGIES.items() if name in strategies
        }

    def of(self, row: int) -> dict[str, np.ndarray]:
        return {
            name: np.array(values[offsets[row] : offsets[row + 1]], dtype=np.float64)
            for name, (values, offsets) in self.sources.items()
        }

    def release(self) -> None:
        """Maps the files anew: the pages read through a mapping count as the process's memory
        for as long as it lasts, so a proteome read through one would hold all of it."""
        for name, (values, offsets) in self.sources.items():
            if isinstance(values, np.memmap):
                mapped = np.memmap(values.filename, values.dtype, "r", values.offset, values.shape)
                self.sources[name] = (mapped, offsets)


def differences(matrix: np.ndarray, positions, wild, mutant) -> np.ndarray:
    """log p(mutant) − log p(wild type) of substitutions at 0-based `positions` of one
    protein's log-probabilities (residues × 20), the amino acids by their columns."""
    return matrix[positions, mutant] - matrix[positions, wild]


def pseudo_ppls(mutants: Embeddings | None) -> dict[str, float]:
    """Each mutant sequence's pseudo-log-likelihood by its ID (`mutant_id`); none without
    `pseudo_ppl`."""
    if mutants is None or not len(mutants):
        return {}
    return dict(zip(mutants.ids(), mutants.array(PLL)[:, 0].astype(np.float64).tolist()))


def relative_plls(record: str, mutants: list[str], plls: dict) -> dict[str, np.ndarray]:
    """`pseudo_ppl` of a record's variants (`mutants`, as the table writes them): each mutant
    sequence's pseudo-log-likelihood minus its wild type's, a log-ratio where higher is fitter
    as the other strategies' are; and the wild type's own (NaN where there is none)."""
    wild = plls.get(wild_type_id(record), np.nan)
    own = np.array([plls.get(mutant_id(record, m), np.nan) for m in mutants], dtype=np.float64)
    return {PSEUDO_PPL: own - wild, WILD_TYPE_PLL: np.full(len(mutants), wild)}


def pllr_of(mutants: Embeddings, window: int):
    """`pllr` of a record's variant, from the mutants' run's logits: the one-pass PLL of its
    mutant minus its wild type's, both cropped to `window` residues around the change
    (esm-variants' `get_PLLR`); NaN for a stop-gain or sequences not computed."""

    def pllr(record: str, variant, sequence: str) -> float:
        change = change_of(variant, sequence)
        if change is None:
            return np.nan
        (wild_id, wild), (mutant_id_, mutant) = pllr_sequences(record, variant, change, window)
        try:
            own = one_pass_pll(mutants.values(mutant_id_, LOGITS), mutant)
            return own - one_pass_pll(mutants.values(wild_id, LOGITS), wild)
        except KeyError:  # failed in the mutants' run
            return np.nan

    return pllr


def least_from(matrix: np.ndarray, wild: np.ndarray) -> np.ndarray:
    """Per 0-based position p of one protein's log-probabilities (residues × 20, `wild` each
    residue's column, -1 for none of the 20): the least log p(a) − log p(wild type) over the 20
    amino acids at p and every position after it. A stop-gain at p scores this, as esm-variants'
    `get_minLLR` does; positions holding X and the like count for none."""
    at = np.arange(len(wild))
    lowest = np.where(wild >= 0, matrix.min(1) - matrix[at, np.maximum(wild, 0)], np.inf)
    return np.minimum.accumulate(lowest[::-1])[::-1]


def table_scores(
    emb, variants, strategies, plls, only: str, sequences: dict[str, str], pllr=None
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The variants' scores, a protein at a time (each variant the sum over its
    substitutions, a stop-gain `least_from` its position, `pllr(record, variant, sequence)`
    its pllr; a variant without an ID is of `only`, the input's one record, and `sequences`
    holds the records of stop-gains and pllr's); the variants whose record has no embedding
    (failed) left out of the returned indices."""
    by_protein = defaultdict(list)
    for k, variant in enumerate(variants):
        by_protein[variant.id].append(k)
    scores = {name: np.full(len(variants), np.nan) for name in score_columns(strategies)}
    scored = np.zeros(len(variants), dtype=bool)
    matrices = Matrices(emb, strategies)
    for id_, members in by_protein.items():
        record = only if id_ is None else id_
        try:
            row = emb.row(record)
        except KeyError:
            continue  # failed: failed_sequences.tsv says why
        if PSEUDO_PPL in strategies:
            relative = relative_plls(record, [variants[k].label for k in members], plls)
            for name, values in relative.items():
                scores[name][members] = values
        if PLLR in strategies:
            scores[PLLR][members] = [pllr(record, variants[k], sequences[record]) for k in members]
        stops = [k for k in members if variants[k].stop]
        # the records' own scores: of substitutions (a mutated_sequence alone has none)
        changes = [k for k in members if not variants[k].stop and variants[k].substitutions]
        substitutions = [s for k in changes for s in variants[k].substitutions]
        variant_of = np.repeat(
            np.array(changes, dtype=np.int64), [len(variants[k].substitutions) for k in changes]
        )
        positions = np.array([s.position - 1 for s in substitutions], dtype=np.int64)
        wild = np.array([COLUMN[s.wild] for s in substitutions], dtype=np.int64)
        mutant = np.array([COLUMN[s.mutant] for s in substitutions], dtype=np.int64)
        for name, matrix in matrices.of(row).items():
            summed = np.bincount(
                variant_of,
                differences(matrix, positions, wild, mutant),
                minlength=len(variants),
            )
            scores[name][changes] = summed[changes]
            if stops:
                least = least_from(matrix, residue_columns(sequences[record]))
                scores[name][stops] = least[[variants[k].stop - 1 for k in stops]]
        scored[members] = True
    kept = np.flatnonzero(scored)
    return kept, {name: values[kept] for name, values in scores.items()}
