"""Where a long protein's scores come from under `long_sequences: chunk`: the windows of the
recipes that the published variant-effect catalogues use, and each window's weight.

A protein longer than the model's window (`truncation_seq_length` residues, 1,022 for ESM-2)
is scored a window at a time:
- `logits` (and `wt_marginals`) by one of two recipes (`score_windows`):
  - `weighted` (esm-variants, Brandes et al. 2023): windows of `window` residues, each
    tokenised on its own with BOS and EOS, overlapping by at least half a window and a residue;
    a residue's log-probabilities are the mean of its windows' weighted by a sigmoid ramp over
    each window's quarter ends (none at the protein's own ends), the weights normalised per
    residue.
  - `overlapping` (ProteinGym's wt-marginals `overlapping`): slices of `window` + 2 tokens of
    the whole token array ([BOS], residues, EOS), two stepping in from either end half a slice
    less one at a time, one more at the centre where the last two overlap by less; weighted the
    same way per token (ramps of a quarter slice, steepness 16).
- `masked_marginals` and `pll`, a pass per residue with it masked: ProteinGym's optimal window,
  the slice of `window` + 2 tokens centred on the masked token, or flush with the end it is
  nearer to.
"""

from typing import NamedTuple

import numpy as np

from ..embeddings_h5.scores import LOGITS, MASKED

RECIPES = ("weighted", "overlapping")
WEIGHTED_STEEPNESS = 20  # the sigmoid's s of esm-variants' get_wt_LLR
OVERLAPPING_STEEPNESS = 16  # ProteinGym's


class Windows(NamedTuple):
    """Windows of one width over a protein's residues (`weighted`) or tokens (`overlapping`):
    where each starts, and each one's weight per position (windows × width)."""

    starts: np.ndarray
    width: int
    weights: np.ndarray

    def combined(self, values: np.ndarray, size: int) -> np.ndarray:
        """The weighted mean per position (`size` of them) of the windows' `values` (windows ×
        width × columns), each position's weights normalised to one."""
        total = np.zeros((size, values.shape[-1]))
        weight = np.zeros(size)
        for start, w, v in zip(self.starts, self.weights, values):
            total[start : start + self.width] += w[:, None] * v
            weight[start : start + self.width] += w
        return total / weight[:, None]


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1 / (1 + np.exp(-x))


def weighted(length: int, window: int) -> Windows:
    """esm-variants' windows over `length` residues (more than `window`): one flush with each
    end, then pairs stepping inwards by `window` less the least overlap (half a window and a
    residue) while what lies between is longer than a window, and one centred on what is left
    where the last pair overlaps by less than the least overlap."""
    least_overlap = window // 2 + 1
    step = window - least_overlap
    starts = []
    low, high = 0, length  # the residues still between the pairs
    while high - low > window:
        starts += [low, high - window]
        low, high = low + step, high - step
    left_end, right_start = starts[-2] + window - 1, starts[-1]
    if left_end - right_start < least_overlap:
        starts.append(low + (high - low) // 2 - window // 2)
    starts = np.sort(np.array(starts))
    ramp = round(least_overlap / 2)
    t = np.arange(ramp)
    rising = _sigmoid((t - ramp / 2) / WEIGHTED_STEEPNESS)
    falling = _sigmoid(-(t - ramp / 2) / WEIGHTED_STEEPNESS)
    weights = np.ones((len(starts), window))
    weights[1:, :ramp] = rising  # none rises at the protein's start, none falls at its end
    weights[:-1, window - ramp :] = falling
    return Windows(starts, window, weights)


def overlapping(tokens: int, window: int) -> Windows:
    """ProteinGym's slices of `window` + 2 tokens over a protein's `tokens` (more than that)."""
    width = window + 2
    step = width // 2 - 1
    starts = []
    left, right = 0, tokens - width
    while True:
        starts += [left, right]
        if left + width - 1 > right:
            break
        left, right = left + step, right - step
    if (left + width - 1) - right + 1 < step:
        starts.append(tokens // 2 - width // 2)
    ramp, s = width // 4, OVERLAPPING_STEEPNESS
    weight = np.ones(width)
    rising = np.arange(1, ramp + 1)
    weight[rising] = _sigmoid((rising - ramp / 2) / s)
    falling = np.arange(window - ramp, window + 1)
    weight[falling] = _sigmoid(-(falling - window + ramp / 2) / s)
    return Windows(np.array(starts), width, np.tile(weight, (len(starts), 1)))


def optimal_starts(masked: np.ndarray, tokens: int, window: int) -> np.ndarray:
    """ProteinGym's optimal window of each masked token (`masked`, token positions) among a
    protein's `tokens`: where its slice of `window` + 2 tokens starts."""
    width = window + 2
    half = width // 2
    if tokens <= width:
        return np.zeros(masked.size, dtype=np.int64)
    return np.where(
        masked < half, 0, np.where(masked >= tokens - half, tokens - width, masked - half)
    ).astype(np.int64)


class Pass(NamedTuple):
    """Forward passes of one size: how many, of how many tokens each."""

    count: int
    tokens: int


def score_passes(length: int, window: int, kinds, recipe: str, bos: int = 1) -> list[Pass]:
    """The forward passes that the scores `kinds` (esmshard.embeddings_h5.scores) of a protein
    of `length` residues, longer than `window`, take: the recipe's windows for `logits`, a
    window per residue for `masked_marginals` and `pll`."""
    passes = []
    if LOGITS in kinds:
        if recipe == "weighted":
            count = len(weighted(length, window).starts)
        else:
            count = len(overlapping(length + bos + 1, window).starts)
        passes.append(Pass(count, window + 2))
    if any(kind in MASKED for kind in kinds):
        passes.append(Pass(length, window + 2))
    return passes
