"""The shard step: read every input once, check it, and split it into size-balanced shards.

Streaming: the first pass keeps 12 bytes per record in memory (the length and a 64-bit hash of
the ID) and spools the sequences and the record table's rows to unnamed temporary files; the
second pass deals the spooled sequences out to the shard files. A shard file is TSV, a header
line `index  id  sequence`, then one record per line in input order.
"""

import tempfile
from array import array
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pyarrow.parquet as pq

from .balance import assign, embedded_residue_counts, record_costs
from .fasta import (
    NUCLEOTIDE_LETTERS,
    NUCLEOTIDE_MIN_LENGTH,
    FastaError,
    looks_nucleotide,
    read_raw,
)
from .files import Buckets, atomic_path, naming_disk_full, write_tsv
from .records import ScanWriter, source, write_table
from .sizing import estimated_text_bytes, shard_names

SHARD_COLUMNS = ["index", "id", "sequence"]
PLAN_COLUMNS = ["shard", "n_sequences", "n_residues", "estimated_cost"]
NAMED_AT_MOST = 20  # records a message lists by name; it counts the rest


def id_hash(id_: str) -> int:
    """64 bits of an ID; Python's own string hash, so equal only within one process."""
    return hash(id_)


class Shard(NamedTuple):
    """One shard file's records, in input order."""

    indices: list[int]
    ids: list[str]
    sequences: list[str]


def read_shard(path) -> Shard:
    indices, ids, sequences = [], [], []
    with open(path) as fh:
        next(fh)  # the header line
        for line in fh:
            index, id_, sequence = line.rstrip("\n").split("\t")
            indices.append(int(index))
            ids.append(id_)
            sequences.append(sequence)
    return Shard(indices, ids, sequences)


@dataclass
class Scan:
    """What the first pass keeps of every record, and what it found wrong."""

    lengths: array = field(default_factory=lambda: array("i"))
    id_hashes: array = field(default_factory=lambda: array("q"))
    nucleotide: dict = field(default_factory=dict)  # path -> [count, first ID, its source]
    too_long: list = field(default_factory=list)  # the first NAMED_AT_MOST, described
    n_too_long: int = 0


def write_shards(
    inputs,
    shard_dir,
    n_shards: int,
    truncation_seq_length: int,
    embed_dim: int,
    long_sequences: str = "truncate",
    nucleotide_check: bool = True,
) -> list[dict]:
    """Read every input once, check it, and write the shard files, the record table and the plan.

    Nothing is written under a final name until every check has passed; every shard file and
    the record table appear together, or none.
    """
    shard_dir = Path(shard_dir)
    shard_dir.mkdir(parents=True, exist_ok=True)
    names = shard_names(n_shards)
    # The spooled sequences, then the shard files (whose atomic writes name a full disk too).
    needed = 2 * estimated_text_bytes(inputs)
    with (
        naming_disk_full(shard_dir, needed),
        tempfile.TemporaryFile(dir=shard_dir) as sequences,
        tempfile.TemporaryFile(dir=shard_dir) as scanned,
    ):
        scan = _scan(inputs, sequences, scanned, truncation_seq_length, long_sequences)
        _refuse_duplicates(scan.id_hashes, scanned)
        del scan.id_hashes[:]
        _refuse_nucleotides(scan.nucleotide if nucleotide_check else {})
        if scan.n_too_long and long_sequences == "fail":
            more = scan.n_too_long - len(scan.too_long)
            raise FastaError(
                f"{scan.n_too_long} sequences are longer than truncation_seq_length "
                f"({truncation_seq_length}) and long_sequences is 'fail': {'; '.join(scan.too_long)}"
                f"{f' and {more} more' if more > 0 else ''}. Set long_sequences to truncate, "
                "chunk or skip, or remove them"
            )

        lengths = np.frombuffer(scan.lengths, dtype=np.int32)
        n_residues = embedded_residue_counts(lengths, truncation_seq_length, long_sequences)
        truncated = (
            n_residues < lengths
            if long_sequences == "truncate"
            else np.zeros(lengths.size, dtype=bool)
        )
        costs = record_costs(lengths, truncation_seq_length, long_sequences, embed_dim)
        shard_of = assign(costs, n_shards)
        plan = _plan(names, shard_of, n_residues, costs)
        del costs

        with ExitStack() as renamed_together:
            paths = [
                renamed_together.enter_context(atomic_path(shard_dir / f"{name}.tsv"))
                for name in names
            ]
            table = renamed_together.enter_context(atomic_path(shard_dir / "records.parquet"))
            _deal_out(sequences, shard_of, paths)
            scanned.seek(0)
            write_table(scanned, table, names, shard_of, n_residues, truncated)
    write_tsv(shard_dir / "plan.tsv", PLAN_COLUMNS, [[p[c] for c in PLAN_COLUMNS] for p in plan])
    return plan


def _scan(inputs, sequences, scanned, truncation_seq_length, long_sequences) -> Scan:
    """The first pass: every record read, checked and spooled; its length and ID hash kept."""
    scan = Scan()
    table = ScanWriter(scanned, [str(path) for path in inputs])
    spool = sequences.write
    index = 0
    for number, path in enumerate(inputs):
        path = str(path)
        for record in read_raw(path):
            length = len(record.sequence)
            scan.lengths.append(length)
            scan.id_hashes.append(id_hash(record.id))
            if length > truncation_seq_length and long_sequences == "fail":
                scan.n_too_long += 1
                if len(scan.too_long) < NAMED_AT_MOST:
                    where = source(path, record.line)
                    scan.too_long.append(f"{record.id} ({length} residues, {where})")
            if looks_nucleotide(record.sequence):
                found = scan.nucleotide.setdefault(path, [0, record.id, source(path, record.line)])
                found[0] += 1
            spool(b"%d\t%s\t%s\n" % (index, record.id.encode(), record.sequence))
            description = record.header[len(record.id) :].lstrip()
            table.add(record.id, length, record.n_replaced, number, record.line, description)
            index += 1
    table.close()
    return scan


def _refuse_duplicates(id_hashes: array, scanned) -> None:
    """IDs must be unique: equal hashes are looked up in the spooled table, by name."""
    hashes = np.frombuffer(id_hashes, dtype=np.int64).copy()
    hashes.sort()
    suspects = set(hashes[1:][hashes[1:] == hashes[:-1]].tolist())
    del hashes
    if not suspects:
        return
    scanned.seek(0)
    first_seen = {}
    for batch in pq.ParquetFile(scanned).iter_batches(columns=["id", "file", "line"]):
        for id_, file, line in zip(*(batch.column(c).to_pylist() for c in ("id", "file", "line"))):
            if id_hash(id_) not in suspects:
                continue
            if id_ in first_seen:
                raise FastaError(
                    f"duplicate ID '{id_}': at {first_seen[id_]} and at {source(file, line)}; "
                    "IDs (the first word of each header) must be unique across all inputs"
                )
            first_seen[id_] = source(file, line)


def _refuse_nucleotides(nucleotide: dict) -> None:
    if not nucleotide:
        return
    found = "; ".join(
        f"{path}: {count} records, e.g. '{first_id}' ({where})"
        for path, (count, first_id, where) in nucleotide.items()
    )
    raise FastaError(
        f"nucleotide sequences where proteins are expected (records of at least {NUCLEOTIDE_MIN_LENGTH} "
        f"letters made only of {', '.join(NUCLEOTIDE_LETTERS)}): {found}. Give the protein FASTA "
        "(e.g. the gene caller's .faa), or set nucleotide_check: false to embed them as they are"
    )


def _plan(names, shard_of, n_residues, costs) -> list[dict]:
    count = np.bincount(shard_of, minlength=len(names))
    residues = np.bincount(shard_of, weights=n_residues, minlength=len(names))
    cost = np.bincount(shard_of, weights=costs, minlength=len(names))
    return [
        {
            "shard": name,
            "n_sequences": int(count[k]),
            "n_residues": int(residues[k]),
            "estimated_cost": float(cost[k]),
        }
        for k, name in enumerate(names)
    ]


def _deal_out(sequences, shard_of, paths, records_at_once: int = 1 << 20) -> None:
    """The second pass: each spooled line to its shard's file, in input order."""
    for path in paths:
        Path(path).write_bytes(("\t".join(SHARD_COLUMNS) + "\n").encode())
    buckets = Buckets(paths)
    add = buckets.add
    sequences.seek(0)
    for start in range(0, shard_of.size, records_at_once):
        for shard, line in zip(shard_of[start : start + records_at_once].tolist(), sequences):
            add(shard, line)
    buckets.flush()
