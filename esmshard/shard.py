"""Splitting the input into size-balanced shards."""
import csv
import heapq
import math
import os
from pathlib import Path

from .fasta import FastaError, read_fasta

# Shard count for `shards: auto`, from the input's size alone (never the GPU count).
TARGET_RESIDUES_PER_SHARD = 10_000_000  # a few minutes of GPU work for the 650M model
MIN_RESIDUES_PER_SHARD = 200_000  # below this, loading the model dominates a job
MIN_SHARDS_FOR_BALANCE = 64  # many more shards than GPUs, while shards stay above the minimum
RESIDUES_PER_BYTE = 0.7  # FASTA headers and newlines take ~30% of a file's bytes
GZIP_EXPANSION = 2.0  # protein FASTA compresses about 2:1

# Cluster requests (SLURM `runtime`, minutes; `mem_mb`), from the cost model above.
ASSUMED_FLOPS = 5e12  # sustained by fair-esm's fp32 forward on a modest datacenter GPU
DEFAULT_ARCH = (33, 1280)  # layers, D: for checkpoints of unknown architecture, assume the 650M model


def embed_runtime_minutes(estimated_cost: float, layers: int, dim: int, attempt: int = 1) -> int:
    """10 minutes for start-up and model loading plus twice the predicted compute; doubled per retry.

    A cost unit is one token of a short sequence: about 24·layers·D² FLOPs.
    """
    seconds = 24 * layers * dim**2 * estimated_cost / ASSUMED_FLOPS
    return math.ceil((10 + 2 * seconds / 60) * 2 ** (attempt - 1))


def embed_mem_mb(layers: int, dim: int) -> int:
    """4 GB plus three copies of the fp32 weights (12·layers·D² parameters) while loading."""
    return 4096 + math.ceil(3 * 4 * 12 * layers * dim**2 / 2**20)


RECORD_COLUMNS = ["index", "id", "shard", "length", "n_residues", "truncated", "n_replaced", "source", "header"]
SHARD_COLUMNS = ["index", "id", "sequence"]
PLAN_COLUMNS = ["shard", "n_sequences", "n_residues", "estimated_cost"]


def estimated_residues(paths) -> int:
    total = 0
    for path in paths:
        size = os.path.getsize(path)
        total += size * GZIP_EXPANSION if str(path).endswith(".gz") else size
    return int(total * RESIDUES_PER_BYTE)


def auto_shard_count(residues: int) -> int:
    by_target = math.ceil(residues / TARGET_RESIDUES_PER_SHARD)
    by_balance = min(MIN_SHARDS_FOR_BALANCE, math.ceil(residues / MIN_RESIDUES_PER_SHARD))
    return max(1, by_target, by_balance)


def shard_names(n_shards: int) -> list[str]:
    width = max(4, len(str(n_shards - 1)))
    return [f"shard_{i:0{width}d}" for i in range(n_shards)]


def estimated_cost(n_residues: int, embed_dim: int) -> float:
    """Relative forward cost: per token, the dense layers cost ~24·D² FLOPs and attention ~4·L·D."""
    tokens = n_residues + 2  # BOS and EOS
    return tokens * (1.0 + tokens / (6.0 * embed_dim))


def chunk_spans(length: int, window: int) -> list[tuple[int, int, int, int]]:
    """Overlapping windows (start, end, keep_from, keep_to) covering `length` residues.

    Consecutive windows overlap by at least a quarter window; each residue is taken from the
    window in which it lies farther from an edge, i.e. each overlap is split at its middle.
    """
    if length <= window:
        return [(0, length, 0, length)]
    step = window - window // 4
    starts = list(range(0, length - window, step)) + [length - window]
    spans = []
    for a in starts:
        keep_from = 0
        if spans:
            prev_a, prev_b, prev_from, _ = spans[-1]
            keep_from = (a + prev_b) // 2
            spans[-1] = (prev_a, prev_b, prev_from, keep_from)
        spans.append((a, a + window, keep_from, a + window))
    return spans


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


def _replace_atomically(tmp_paths: dict[Path, Path]) -> None:
    for final, tmp in tmp_paths.items():
        os.replace(tmp, final)


def embedded_residues(length: int, truncation_seq_length: int, long_sequences: str) -> int:
    """Residues of a record that the embed job will compute, under the long-sequence policy."""
    if length <= truncation_seq_length or long_sequences == "chunk":
        return length
    return truncation_seq_length if long_sequences == "truncate" else 0


def record_cost(length: int, truncation_seq_length: int, long_sequences: str, embed_dim: int) -> float:
    if length > truncation_seq_length and long_sequences == "chunk":
        return sum(estimated_cost(b - a, embed_dim) for a, b, _, _ in chunk_spans(length, truncation_seq_length))
    return estimated_cost(embedded_residues(length, truncation_seq_length, long_sequences), embed_dim)


def write_shards(inputs, shard_dir, n_shards: int, truncation_seq_length: int, embed_dim: int,
                 long_sequences: str = "truncate") -> list[dict]:
    """Read every input once, check IDs, and write the shard files, the record table and the plan.

    The sequences go to a spool file on the first pass so that the assignment can see all
    lengths before any shard file is written.
    """
    shard_dir = Path(shard_dir)
    shard_dir.mkdir(parents=True, exist_ok=True)
    names = shard_names(n_shards)
    spool_path = shard_dir / ".spool.tmp"
    records, first_seen, costs, too_long = [], {}, [], []
    with open(spool_path, "w") as spool:
        for path in inputs:
            for record in read_fasta(path):
                if record.id in first_seen:
                    raise FastaError(
                        f"duplicate ID '{record.id}': at {first_seen[record.id]} and at {record.source}; "
                        "IDs (the first word of each header) must be unique across all inputs"
                    )
                first_seen[record.id] = record.source
                length = len(record.sequence)
                if length > truncation_seq_length and long_sequences == "fail":
                    too_long.append(f"{record.id} ({length} residues, {record.source})")
                kept = embedded_residues(length, truncation_seq_length, long_sequences)
                records.append(
                    [len(records), record.id, None, length, kept, int(long_sequences == "truncate" and kept < length),
                     record.n_replaced, record.source, record.header]
                )
                costs.append(record_cost(length, truncation_seq_length, long_sequences, embed_dim))
                spool.write(record.sequence + "\n")
    del first_seen
    if too_long:
        spool_path.unlink()
        raise FastaError(
            f"{len(too_long)} sequences are longer than truncation_seq_length ({truncation_seq_length}) "
            f"and long_sequences is 'fail': {'; '.join(too_long)}. Set long_sequences to truncate, "
            "chunk or skip, or remove them"
        )

    shard_of = assign(costs, n_shards)
    plan = [{"shard": name, "n_sequences": 0, "n_residues": 0, "estimated_cost": 0.0} for name in names]
    for row, shard in zip(records, shard_of):
        row[2] = names[shard]
        plan[shard]["n_sequences"] += 1
        plan[shard]["n_residues"] += row[4]
        plan[shard]["estimated_cost"] += costs[row[0]]

    tmp = {shard_dir / f"{name}.tsv": shard_dir / f".{name}.tsv.tmp" for name in names}
    _write_shard_files(spool_path, records, shard_of, list(tmp.values()))
    spool_path.unlink()

    tmp[shard_dir / "records.tsv"] = shard_dir / ".records.tsv.tmp"
    _write_tsv(tmp[shard_dir / "records.tsv"], RECORD_COLUMNS, records)
    tmp[shard_dir / "plan.tsv"] = shard_dir / ".plan.tsv.tmp"
    _write_tsv(tmp[shard_dir / "plan.tsv"], PLAN_COLUMNS, [[p[c] for c in PLAN_COLUMNS] for p in plan])
    _replace_atomically(tmp)
    return plan


def _write_shard_files(spool_path, records, shard_of, paths, files_at_once=256) -> None:
    """Distribute the spooled sequences, a block of shard files at a time (open-file limits)."""
    for first in range(0, len(paths), files_at_once):
        block = paths[first:first + files_at_once]
        handles = [open(path, "w", newline="") for path in block]
        try:
            writers = [csv.writer(fh, delimiter="\t", lineterminator="\n") for fh in handles]
            for writer in writers:
                writer.writerow(SHARD_COLUMNS)
            with open(spool_path) as spool:
                for row, shard, sequence in zip(records, shard_of, spool):
                    if first <= shard < first + len(block):
                        writers[shard - first].writerow([row[0], row[1], sequence.rstrip("\n")])
        finally:
            for fh in handles:
                fh.close()


def _write_tsv(path, columns, rows) -> None:
    with open(path, "w", newline="") as fh:
        writer = csv.writer(fh, delimiter="\t", lineterminator="\n")
        writer.writerow(columns)
        writer.writerows(rows)


def read_tsv(path) -> list[dict]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh, delimiter="\t"))
