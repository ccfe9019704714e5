"""Size balance: each record's estimated cost, and records assigned to shards by cost.

A new balancing rule is a change here alone.
"""

import numpy as np

from .long_sequences import chunk_spans, embedded_residues

# Records placed per step of `assign` (whole rounds of one record per shard).
RECORDS_PER_STEP = 8192
MIN_STEPS = 64  # the loads are looked at again at least this often


def estimated_cost(n_residues, embed_dim: int):
    """Relative forward cost: per token, the dense layers cost ~24·D² FLOPs and attention ~4·L·D."""
    tokens = n_residues + 2  # BOS and EOS
    return tokens * (1.0 + tokens / (6.0 * embed_dim))


def record_cost(
    length: int, truncation_seq_length: int, long_sequences: str, embed_dim: int
) -> float:
    if length > truncation_seq_length and long_sequences == "chunk":
        return sum(
            estimated_cost(span.end - span.start, embed_dim)
            for span in chunk_spans(length, truncation_seq_length)
        )
    return estimated_cost(
        embedded_residues(length, truncation_seq_length, long_sequences), embed_dim
    )


def embedded_residue_counts(
    lengths: np.ndarray, truncation_seq_length: int, long_sequences: str
) -> np.ndarray:
    """`embedded_residues` of every record at once."""
    if long_sequences == "chunk":
        return lengths.copy()
    longer = truncation_seq_length if long_sequences == "truncate" else 0
    return np.where(lengths <= truncation_seq_length, lengths, longer).astype(lengths.dtype)


def forward_passes(kept: np.ndarray, masked: bool) -> np.ndarray:
    """The forward passes over each record of `kept` residues: one, and with masked marginals
    (`include: masked_marginals` or `pll`) one more per residue, its copy with it masked."""
    return kept.astype(np.int64) + 1 if masked else np.ones(kept.shape, dtype=np.int64)


def record_costs(
    lengths: np.ndarray,
    truncation_seq_length: int,
    long_sequences: str,
    embed_dim: int,
    masked: bool = False,
) -> np.ndarray:
    """`record_cost` of every record at once, as float32, times its forward passes."""
    kept = embedded_residue_counts(lengths, truncation_seq_length, long_sequences)
    costs = estimated_cost(kept.astype(np.float32), embed_dim).astype(np.float32)
    costs *= forward_passes(kept, masked)
    if long_sequences == "chunk":
        for i in np.flatnonzero(lengths > truncation_seq_length):
            costs[i] = record_cost(int(lengths[i]), truncation_seq_length, "chunk", embed_dim)
    return costs


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
