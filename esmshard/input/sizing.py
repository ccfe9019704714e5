"""How many shards, and what each job asks a cluster for, from the work's size and the model."""

import functools
import math
import os
from typing import NamedTuple

from .fasta import compression

# `shards: auto`, from the residues to compute and the model: shards as many as possible while a
# job's fixed cost (process start, imports, model loading, CUDA start-up) stays under 2.5% (3% with
# a margin) of its GPU time on a fast GPU; and at least one per embed job that runs at once (on a
# cluster, where each holds at least a job's fixed cost of work).
JOB_OVERHEAD_SECONDS = 20
TARGET_OVERHEAD_FRACTION = 0.025
MAX_SHARDS = 4096  # beyond this, shards grow instead (Snakemake plans every job up front)
FAST_GPU_FLOPS = 3.3e14  # an H100 in bf16: 250k tokens/s for the 650M model
MAX_TOKENS_PER_SECOND = 2e6  # small models are held back by other things than their FLOPs
BYTES_PER_RECORD = 300  # FASTA bytes per record, on the short side (E. coli: 430)
COMPRESSED_EXPANSION = 2.0  # protein FASTA compresses about 2:1

# Cluster requests (SLURM `runtime`, minutes; `mem_mb`), from the cost model in balance.py.
ASSUMED_FLOPS = 2.5e13  # sustained by a recent datacenter GPU in bf16 or tf32


class DeviceKind(NamedTuple):
    """A kind of GPU, and what an embed job sustains on it in bf16 (FLOP/s)."""

    name: str
    flops: float
    basis: str  # where the figure comes from
    fp8: bool = True  # whether it computes FP8 products (`precision: fp8`: Hopper and newer)


# `esmshard plan`'s GPU-hours: the H200's measured rate (esm2_t33_650M, packed and compiled, in
# bf16: 324k tokens/s at 2·params FLOPs each, docs/benchmarks.md), and the other kinds scaled
# from it (the H100's compute is the H200's, its memory slower: the goals take 0.9 of it).
H200_FLOPS = 324_000 * 2 * 12 * 33 * 1280**2
DEVICE_KINDS = (
    DeviceKind("H200", H200_FLOPS, "the FLOP/s measured with esm2_t33_650M, at this model's size"),
    DeviceKind("H100", 0.9 * H200_FLOPS, "0.9 of the H200's"),
    DeviceKind("A100", H200_FLOPS * 312 / 989, "the H200's by their bf16 peaks, 312/989", False),
)


# An embed job on a CPU (its two threads): esm2_t6's shape sustains about 10¹¹ FLOP/s on this
# project's 2-core test machine (6.9k residues/s, docs/benchmarks.md, "A resumed run's ETA").
CPU_FLOPS = 1e11


def compute_seconds(tokens: float, params: int, flops: float) -> float:
    """The time of `tokens` (or cost units) at 2·params FLOPs each, on a device sustaining
    `flops`."""
    return 2 * params * tokens / flops


def gpu_seconds(costs, params: int, flops: float) -> float:
    """The GPU time of shards of these estimated costs (balance.py's units): each job's fixed
    cost, then its compute."""
    return len(costs) * JOB_OVERHEAD_SECONDS + compute_seconds(sum(costs), params, flops)


class ModelSize(NamedTuple):
    """What the cost of a model's forward pass scales with."""

    params: int  # its layers' parameters: a token costs 2·params FLOPs (ESM-2: 12·layers·D²)
    dim: int  # D: attention's share grows with the length over D (esmshard.input.balance)


def estimated_text_bytes(paths) -> int:
    """The inputs' size once decompressed, estimated from the files' sizes (`paths` a mapping:
    the sizes of objects that are not on this machine, by path)."""
    if isinstance(paths, dict):  # objects: compressed by their names
        packed = {p: p.endswith((".gz", ".bz2", ".xz")) for p in paths}
        sizes = paths
    else:
        packed = {p: compression(p) is not None for p in paths}
        sizes = {p: os.path.getsize(p) for p in paths}
    return int(sum(size * (COMPRESSED_EXPANSION if packed[p] else 1) for p, size in sizes.items()))


def estimated_records(paths) -> int:
    return int(estimated_text_bytes(paths) / BYTES_PER_RECORD)


def fast_gpu_seconds(residues: int, params: int) -> float:
    """The input's work on a fast GPU: 2·params FLOPs per token (esmshard.input.balance)."""
    tokens_per_second = min(FAST_GPU_FLOPS / (2 * params), MAX_TOKENS_PER_SECOND)
    return residues / tokens_per_second


def auto_shard_count(residues: int, params: int, slots: int = 1, cluster: bool = False) -> int:
    """Shards for `residues` of work: as many as the job-overhead rule allows, and at least
    `slots`, the embed jobs that run at once. On one machine all of them (an idle GPU costs
    nothing, and jobs starting side by side take no longer than one); on a cluster, where each
    job waits in a queue, as many as hold a job's fixed cost of work each at least. The caller
    keeps it to the number of sequences."""
    seconds = fast_gpu_seconds(residues, params)
    by_overhead = math.floor(seconds / (JOB_OVERHEAD_SECONDS / TARGET_OVERHEAD_FRACTION))
    floor = min(slots, math.floor(seconds / JOB_OVERHEAD_SECONDS)) if cluster else slots
    return max(1, floor, min(MAX_SHARDS, by_overhead))


def embed_runtime_minutes(estimated_cost: float, params: int, attempt: int = 1) -> int:
    """10 minutes for start-up and model loading plus twice the predicted compute; doubled per retry.

    A cost unit is one token of a short sequence: about 2·params FLOPs.
    """
    seconds = 2 * params * estimated_cost / ASSUMED_FLOPS
    return math.ceil((10 + 2 * seconds / 60) * 2 ** (attempt - 1))


def records_mem_mb(inputs, bytes_per_record: int) -> int:
    """Memory for a step that keeps `bytes_per_record` per input record, and 2 GB."""
    return 2048 + math.ceil(bytes_per_record * estimated_records(inputs) / 2**20)


def io_runtime_minutes(size_mb: float, attempt: int = 1) -> int:
    """Minutes for a step that streams its inputs once: 10 plus a minute per 200 MB."""
    return math.ceil(10 + size_mb / 200) * attempt


@functools.cache
def _plan_costs(plan_path: str, plan_mtime_ns: int) -> dict[str, float]:
    from ..files import read_tsv

    return {row["shard"]: float(row["estimated_cost"]) for row in read_tsv(plan_path)}


def shard_runtime_minutes(plan_path: str, shard: str, params: int, attempt: int = 1):
    """embed_runtime_minutes of a planned shard, the plan read once per version of it (not per
    job); None before the plan exists."""
    if not os.path.isfile(plan_path):
        return None
    costs = _plan_costs(plan_path, os.stat(plan_path).st_mtime_ns)
    return embed_runtime_minutes(costs[shard], params, attempt)


def embed_mem_mb(params: int) -> int:
    """4 GB plus the fp32 weights once, and a quarter more: a checkpoint's tensors are
    memory-mapped into the model, not copied (esmshard.models.esm2.load_checkpoint), and the
    fast path adds q, k and v as one product."""
    return 4096 + math.ceil(1.25 * 4 * params / 2**20)


def host_memory_bytes() -> int | None:
    """The memory this machine gives a process: its physical memory, or its cgroup's limit where
    that is less (a container's); None where neither can be read (not Linux)."""
    try:
        memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None
    try:
        with open("/sys/fs/cgroup/memory.max") as fh:
            limit = fh.read().strip()
    except OSError:
        return memory
    return min(memory, int(limit)) if limit.isdigit() else memory


def cpu_memory_problem(model: str, params: int, memory: int | None) -> str | None:
    """Why `model` cannot compute on this machine's CPU: an embed job's memory (embed_mem_mb:
    the fp32 weights and its working memory) beyond `memory`, the machine's; else None."""
    needed = embed_mem_mb(params) * 2**20
    if memory is None or needed <= memory:
        return None
    return (
        f"model {model} computes on the CPU here, where an embed job needs about "
        f"{needed / 2**30:.0f} GiB of memory ({params / 1e9:.1f} billion parameters in fp32, "
        f"and its working memory), and this machine has {memory / 2**30:.0f} GiB: run it "
        "on GPUs, on a machine with more memory, or with a smaller model"
    )
