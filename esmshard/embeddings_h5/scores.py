"""Language-model scores as esmshard keeps them: log-probabilities of the 20 amino acids.

`logits` are each residue's log-softmax over the model's whole vocabulary (fair-esm's
`log_softmax(model(tokens)["logits"])`) in one forward pass; `masked_marginals` the same with
that residue masked, a pass per residue (fair-esm's `predict.py`, `masked-marginals`). Of the
vocabulary, the columns of the 20 amino acids are kept, in the order of AMINO_ACIDS: a score of
a substitution is a difference of two of them. `pll` is each protein's pseudo-log-likelihood
(the sum over its residues of the log-probability of the residue itself, that residue masked;
any residue letter the model has, X included) and that sum divided by its length.
"""

import numpy as np

LOGITS, MASKED_MARGINALS, PLL = "logits", "masked_marginals", "pll"
AMINO_ACIDS = tuple("ACDEFGHIKLMNPQRSTVWY")  # the columns of logits and masked marginals
PLL_COLUMNS = ("pll", "pll_per_residue")
# The kinds that need the language-model head, and those that need a pass per residue.
NEEDS_HEAD = (LOGITS, MASKED_MARGINALS, PLL)
MASKED = (MASKED_MARGINALS, PLL)
COLUMN = {letter: k for k, letter in enumerate(AMINO_ACIDS)}
_BYTE_COLUMN = np.full(256, -1, dtype=np.int64)  # each byte's column in AMINO_ACIDS, or -1
_BYTE_COLUMN[[ord(letter) for letter in AMINO_ACIDS]] = np.arange(len(AMINO_ACIDS))


def column_tokens(tok_to_idx: dict) -> list[int]:
    """The vocabulary index of each of AMINO_ACIDS."""
    return [tok_to_idx[letter] for letter in AMINO_ACIDS]


def residue_columns(sequence: str | bytes) -> np.ndarray:
    """Each residue's column in AMINO_ACIDS (-1: a letter that is not one of them)."""
    if isinstance(sequence, str):  # a letter beyond Latin-1 is one `?`: none of them
        sequence = sequence.encode("latin-1", errors="replace")
    return _BYTE_COLUMN[np.frombuffer(sequence, dtype=np.uint8)]
