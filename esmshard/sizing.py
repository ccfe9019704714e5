"""How many shards, and what each job asks a cluster for, from the input's size and the model."""

import math
import os

from .fasta import compression

# Shard count for `shards: auto`, from the input's size alone (never the GPU count).
TARGET_RESIDUES_PER_SHARD = 10_000_000  # a few minutes of GPU work for the 650M model
MIN_RESIDUES_PER_SHARD = 200_000  # below this, loading the model dominates a job
MIN_SHARDS_FOR_BALANCE = 64  # many more shards than GPUs, while shards stay above the minimum
RESIDUES_PER_BYTE = 0.7  # FASTA headers and newlines take ~30% of a file's bytes
COMPRESSED_EXPANSION = 2.0  # protein FASTA compresses about 2:1

# Cluster requests (SLURM `runtime`, minutes; `mem_mb`), from the cost model in balance.py.
ASSUMED_FLOPS = 5e12  # sustained by fair-esm's fp32 forward on a modest datacenter GPU
DEFAULT_ARCH = (
    33,
    1280,
)  # layers, D: for checkpoints of unknown architecture, assume the 650M model


def estimated_text_bytes(paths) -> int:
    """The inputs' size once decompressed, estimated from the files' sizes."""
    return int(
        sum(os.path.getsize(p) * (COMPRESSED_EXPANSION if compression(p) else 1) for p in paths)
    )


def estimated_residues(paths) -> int:
    return int(estimated_text_bytes(paths) * RESIDUES_PER_BYTE)


def auto_shard_count(residues: int) -> int:
    by_target = math.ceil(residues / TARGET_RESIDUES_PER_SHARD)
    by_balance = min(MIN_SHARDS_FOR_BALANCE, math.ceil(residues / MIN_RESIDUES_PER_SHARD))
    return max(1, by_target, by_balance)


def shard_names(n_shards: int) -> list[str]:
    width = max(4, len(str(n_shards - 1)))
    return [f"shard_{i:0{width}d}" for i in range(n_shards)]


def embed_runtime_minutes(estimated_cost: float, layers: int, dim: int, attempt: int = 1) -> int:
    """10 minutes for start-up and model loading plus twice the predicted compute; doubled per retry.

    A cost unit is one token of a short sequence: about 24·layers·D² FLOPs.
    """
    seconds = 24 * layers * dim**2 * estimated_cost / ASSUMED_FLOPS
    return math.ceil((10 + 2 * seconds / 60) * 2 ** (attempt - 1))


def embed_mem_mb(layers: int, dim: int) -> int:
    """4 GB plus three copies of the fp32 weights (12·layers·D² parameters) while loading."""
    return 4096 + math.ceil(3 * 4 * 12 * layers * dim**2 / 2**20)
