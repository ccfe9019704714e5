"""Changes beyond substitutions, as esm-variants scores them with `get_PLLR` (strategy `pllr`):
an insertion, a deletion or a multi-residue change given as the whole mutant sequence
(ProteinGym's `mutated_sequence`), with where it starts (`start_pos`, 1-based, as
esm-variants' multi-residue CSV writes it; else the first residue that differs).

Its score is the mutant's one-pass pseudo-log-likelihood minus the wild type's (each the sum over
its residues of the log-probability of the residue itself, unmasked, one forward pass), both
cropped to one window around the change where either is longer than the window (`crop`,
esm-variants' `crop_indel`).
"""

from typing import NamedTuple

import numpy as np

from ..embeddings_h5.scores import residue_columns


class Change(NamedTuple):
    wild: str  # the record's sequence
    mutant: str  # the whole mutant sequence
    start: int  # where the change starts, 1-based in the record


def first_difference(wild: str, mutant: str) -> int | None:
    """The 1-based position of the first residue where `mutant` differs from `wild` (one
    past the shorter where one is the other's start); None where they are the same."""
    for k, (a, b) in enumerate(zip(wild, mutant)):
        if a != b:
            return k + 1
    return None if len(wild) == len(mutant) else min(len(wild), len(mutant)) + 1


def crop(change: Change, window: int) -> tuple[str, str]:
    """The wild type and the mutant as `pllr` scores them: whole where both fit `window`
    residues; else each cut to the window around the change's start, as esm-variants'
    `crop_indel` cuts them (half a window before the start, the rest after, the mutant's end
    moved by the difference of their lengths, and the window moved left where it would run past
    the longer one's end)."""
    wild, mutant = change.wild, change.mutant
    if max(len(wild), len(mutant)) <= window:
        return wild, mutant
    left = change.start - 1
    longer_by = len(wild) - len(mutant)
    begin = int(left - window / 2)  # int(): towards 0, as the reference truncates
    end_wild = int(left + window / 2) - min(begin, 0) + min(longer_by, 0)
    end_mutant = int(left + window / 2) - min(begin, 0) - max(longer_by, 0)
    begin = max(begin, 0)
    end_wild, end_mutant = min(end_wild, len(wild)), min(end_mutant, len(mutant))
    if begin > 0 and max(end_wild, end_mutant) - begin < window:
        begin = max(0, max(end_wild, end_mutant) - window)
    return wild[begin:end_wild], mutant[begin:end_mutant]


def one_pass_pll(log_probs: np.ndarray, sequence: str) -> float:
    """The sum over `sequence`'s residues of each one's log-probability in one unmasked pass
    (`log_probs`: residues × 20, esmshard's `logits`); NaN where a residue is none of the 20."""
    columns = residue_columns(sequence)
    if (columns < 0).any():
        return float("nan")
    return float(log_probs[np.arange(len(sequence)), columns].astype(np.float64).sum())
