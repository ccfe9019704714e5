"""Size balance: each record's estimated cost, and records assigned to shards by cost.

A new balancing rule is a change here alone.
"""

import numpy as np

from ..embeddings_h5.scores import MASKED
from .long_sequences import chunk_spans, embedded_residues
from .score_windows import Pass, score_passes

# Records placed per step of `assign` (whole rounds of one record per shard).
RECORDS_PER_STEP = 8192
MIN_STEPS = 64  # the loads are looked at again at least this often


def estimated_cost(n_residues, embed_dim: int):
    """Relative forward cost: per token, the dense layers cost ~24·D² FLOPs and attention ~4·L·D."""
    tokens = n_residues + 2  # BOS and EOS
    return tokens * (1.0 + tokens / (6.0 * embed_dim))


def chunked_passes(length: int, window: int, include=(), recipe: str = "weighted") -> list[Pass]:
    """The forward passes over a record of `length` residues, longer than `window`, under
    `long_sequences: chunk`: its embedding's windows, and its scores' (esmshard.input.score_windows)."""
    spans = [Pass(1, span.end - span.start + 2) for span in chunk_spans(length, window)]
    return spans + score_passes(length, window, include, recipe)


def record_cost(
    length: int,
    truncation_seq_length: int,
    long_sequences: str,
    embed_dim: int,
    include=(),
    recipe: str = "weighted",
) -> float:
    if length > truncation_seq_length and long_sequences == "chunk":
        return sum(
            p.count * estimated_cost(p.tokens - 2, embed_dim)
            for p in chunked_passes(length, truncation_seq_length, include, recipe)
        )
    kept = embedded_residues(length, truncation_seq_length, long_sequences)
    masked = any(kind in MASKED for kind in include)
    return estimated_cost(kept, embed_dim) * int(forward_passes(np.array([kept]), masked)[0])


def embedded_residue_counts(
    lengths: np.ndarray, truncation_seq_length: int, long_sequences: str
) -> np.ndarray:
    """`embedded_residues` of every record at once."""
    if long_sequences == "chunk":
        return lengths.copy()
    longer = truncation_seq_length if long_sequences == "truncate" else 0
    return np.where(lengths <= truncation_seq_length, lengths, longer).astype(lengths.dtype)


def forward_passes(kept: np.ndarray, masked: bool) -> np.ndarray:
    """The forward passes over each record of `kept` residues (not chunked): one, and with
    masked marginals (`include: masked_marginals` or `pll`) one more per residue, its copy with
    it masked."""
    return kept.astype(np.int64) + 1 if masked else np.ones(kept.shape, dtype=np.int64)


def chunked(lengths: np.ndarray, truncation_seq_length: int, long_sequences: str) -> np.ndarray:
    """Which of the records of `lengths` go through windows."""
    if long_sequences != "chunk":
        return np.zeros(lengths.shape, dtype=bool)
    return lengths > truncation_seq_length


def record_costs(
    lengths: np.ndarray,
    truncation_seq_length: int,
    long_sequences: str,
    embed_dim: int,
    include=(),
    recipe: str = "weighted",
) -> np.ndarray:
    """`record_cost` of every record at once, as float32."""
    kept = embedded_residue_counts(lengths, truncation_seq_length, long_sequences)
    costs = estimated_cost(kept.astype(np.float32), embed_dim).astype(np.float32)
    costs *= forward_passes(kept, any(kind in MASKED for kind in include))
    for i in np.flatnonzero(chunked(lengths, truncation_seq_length, long_sequences)):
        costs[i] = record_cost(
            int(lengths[i]), truncation_seq_length, "chunk", embed_dim, include, recipe
        )
    return costs


def forward_tokens(
    lengths: np.ndarray,
    truncation_seq_length: int,
    long_sequences: str,
    include=(),
    recipe: str = "weighted",
) -> int:
    """The tokens of every forward pass over records of `lengths`, BOS and EOS included: with
    masked marginals each residue's masked copy too, and a chunked record's every window."""
    return int(
        record_tokens(lengths, truncation_seq_length, long_sequences, include, recipe).sum()
    )


def record_tokens(
    lengths: np.ndarray,
    truncation_seq_length: int,
    long_sequences: str,
    include=(),
    recipe: str = "weighted",
) -> np.ndarray:
    """`forward_tokens` of each record."""
    lengths = np.asarray(lengths)
    kept = embedded_residue_counts(lengths, truncation_seq_length, long_sequences)
    windowed = chunked(lengths, truncation_seq_length, long_sequences)
    tokens = np.zeros(len(lengths), dtype=np.int64)
    whole = kept[~windowed].astype(np.int64)
    masked = any(kind in MASKED for kind in include)
    tokens[~windowed] = (whole + 2) * forward_passes(whole, masked)
    for k in np.flatnonzero(windowed):
        passes = chunked_passes(int(lengths[k]), truncation_seq_length, include, recipe)
        tokens[k] = sum(p.count * p.tokens for p in passes)
    return tokens


def assign(costs, n_shards: int) -> np.ndarray:
    """The shard of each record: costliest first, each round of n_shards records dealt out so
    that the costliest goes to the least-loaded shard, alternating direction between rounds.

    Like longest-processing-time-first, no shard ends more than the costliest record above
    another; the loads are re-sorted every step of whole rounds, so 100 million records take
    seconds. Ties break by input order and shard number, so the result is deterministic.
    """
    costs = np.asarray(costs, dtype=np.float32)
    order = np.argsort(-costs, kind="stable")
    shard_of = np.empty(costs.size, dtype=np.int32)
    loads = np.zeros(n_shards)
    rounds = -(-costs.size // n_shards)
    rounds_per_step = max(1, min(RECORDS_PER_STEP // n_shards, rounds // MIN_STEPS))
    step = rounds_per_step * n_shards
    position = np.arange(step) % n_shards
    odd_round = (np.arange(step) // n_shards) % 2 == 1
    rank = np.where(odd_round, n_shards - 1 - position, position)
    for start in range(0, costs.size, step):
        block = order[start : start + step]
        by_load = np.argsort(loads, kind="stable")  # least loaded first
        targets = by_load[rank[: block.size]]
        shard_of[block] = targets
        loads += np.bincount(targets, weights=costs[block], minlength=n_shards)
    return shard_of
