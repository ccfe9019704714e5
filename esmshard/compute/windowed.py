"""A long protein's language-model scores under `long_sequences: chunk`, window by window.

The windows and their weights are esmshard.input.score_windows' (the recipes of esm-variants and
ProteinGym); here they are passed through the model in batches within the token budget (halved
on out-of-memory, down to one window) and their log-probabilities combined: `logits` as the
recipe's weighted mean per residue, `masked_marginals` and `pll` from each residue's own
window with it masked, each batch of those passes handed to the embedder's `passes` (which
an embed job keeps in the store, so that its next job goes on from there).
"""

import logging
import time
from collections.abc import Callable

import numpy as np
import torch

from ..embeddings_h5.scores import LOGITS, MASKED_MARGINALS, PLL, column_tokens
from ..input.score_windows import optimal_starts, overlapping, weighted
from ..store.passes import Rows

log = logging.getLogger(__name__)


def log_probs(
    embedder,
    rows_of: Callable[[np.ndarray], np.ndarray],
    n: int,
    width: int,
    at: np.ndarray,
    masked: bool,
    start: int = 0,
    on_batch: Callable[[int, np.ndarray], None] | None = None,
) -> np.ndarray:
    """(n - start) × k × vocabulary: the log-probabilities at the k positions `at` (n × k) of
    each of the token rows of `width` that `rows_of(indices)` makes, from row `start` on (the
    first of the k masked where `masked`); each batch's also to `on_batch`, with its first
    row."""
    budget = embedder.budget(width) if callable(embedder.budget) else embedder.budget
    per_batch = max(1, budget // width)
    out = []
    while start < n:
        stop = min(n, start + per_batch)
        toks = rows_of(np.arange(start, stop))
        count = stop - start
        if masked:
            toks[np.arange(count), at[start:stop, 0]] = embedder.alphabet.mask_idx
        flat = (np.arange(count)[:, None] * width + at[start:stop]).reshape(-1)
        try:
            logp = embedder.window_log_probs(toks, flat)
        except torch.OutOfMemoryError:
            if per_batch == 1:
                raise
            if embedder.device.type == "cuda":
                torch.cuda.empty_cache()
            per_batch //= 2
            log.warning("out of memory on %d windows; retrying %d at a time", count, per_batch)
            continue
        out.append(logp.cpu().numpy().reshape(count, at.shape[1], -1))
        if on_batch is not None:
            on_batch(start, out[-1])
        start = stop
        time.sleep(embedder.seconds_per_batch)
    return np.concatenate(out) if out else np.zeros((0, at.shape[1], 0), np.float32)


def chunked_scores(embedder, sequence: str, window: int, kinds, recipe: str, index=0) -> dict:
    """The scores `kinds` (logits, masked marginals, pll) of `sequence`, longer than `window`
    residues, as esmshard keeps them (float32; logits and masked marginals residues × 20);
    `index` names it to the embedder's `passes`."""
    columns = np.array(column_tokens(embedder.alphabet.tok_to_idx))
    bos, length = embedder.bos, len(sequence)
    toks = embedder.tokens([sequence]).numpy()[0]  # [BOS], residues, EOS
    values = {}
    if LOGITS in kinds:
        if recipe == "weighted":  # each window tokenised on its own
            windows = weighted(length, window)
            size = length

            def rows_of(indices):
                starts = windows.starts[indices]
                return embedder.tokens([sequence[s : s + window] for s in starts]).numpy()

            at = np.arange(bos, bos + window)
        else:  # slices of the whole token array
            windows = overlapping(len(toks), window)
            size = len(toks)

            def rows_of(indices):
                return toks[windows.starts[indices, None] + np.arange(windows.width)]

            at = np.arange(windows.width)
        n = len(windows.starts)
        logp = log_probs(embedder, rows_of, n, window + 2, np.tile(at, (n, 1)), masked=False)
        combined = windows.combined(logp[:, :, columns], size)
        values[LOGITS] = combined if recipe == "weighted" else combined[bos : bos + length]
    if MASKED_MARGINALS in kinds or PLL in kinds:
        masked_at = np.arange(length) + bos
        starts = optimal_starts(masked_at, len(toks), window)
        width = window + 2

        def masked_rows(indices):
            return toks[starts[indices, None] + np.arange(width)]

        def keep(first, logp):  # a batch of passes: each masked residue's scores
            at = masked_at[first : first + len(logp)]
            embedder.passes.add(
                index, logp[:, 0, columns], logp[np.arange(len(logp)), 0, toks[at]]
            )
            embedder.passes.batch_done()

        done = embedder.passes.begin(index, length)
        log_probs(embedder, masked_rows, length, width, (masked_at - starts)[:, None], True,
                  done, keep)  # fmt: skip
        rows = Rows.on_host(embedder.passes.finish(index))
        if MASKED_MARGINALS in kinds:
            values[MASKED_MARGINALS] = rows.marginals
        if PLL in kinds:
            total = float(rows.own.astype(np.float64).sum())
            values[PLL] = np.array([total, total / length])
    return {kind: np.asarray(v, dtype=np.float32) for kind, v in values.items()}
