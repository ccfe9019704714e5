"""Size balance: each record's estimated cost, and records assigned to shards by cost.

A new balancing rule is a change here alone.
"""

import heapq

from .long_sequences import chunk_spans, embedded_residues


def estimated_cost(n_residues: int, embed_dim: int) -> float:
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


def assign(costs: list[float], n_shards: int) -> list[int]:
    """Longest-processing-time-first: each record, costliest first, goes to the least-loaded shard.

    Ties break by input order and shard number, so the result is deterministic.
    """
    heap = [(0.0, shard) for shard in range(n_shards)]
    shard_of = [0] * len(costs)
    for index in sorted(range(len(costs)), key=lambda i: (-costs[i], i)):
        load, shard = heapq.heappop(heap)
        shard_of[index] = shard
        heapq.heappush(heap, (load + costs[index], shard))
    return shard_of
