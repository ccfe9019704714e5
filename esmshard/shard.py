"""The shard step: read every input once, check it, and split it into size-balanced shards."""

import csv
import tempfile
from contextlib import ExitStack
from pathlib import Path

from .balance import assign, record_cost
from .fasta import (
    NUCLEOTIDE_LETTERS,
    NUCLEOTIDE_MIN_LENGTH,
    FastaError,
    looks_nucleotide,
    read_fasta,
)
from .files import atomic_path, naming_disk_full, write_tsv
from .long_sequences import embedded_residues
from .sizing import estimated_text_bytes, shard_names

RECORD_COLUMNS = [
    "index",
    "id",
    "shard",
    "length",
    "n_residues",
    "truncated",
    "n_replaced",
    "source",
    "header",
]
SHARD_COLUMNS = ["index", "id", "sequence"]
PLAN_COLUMNS = ["shard", "n_sequences", "n_residues", "estimated_cost"]


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

    The sequences go to an unnamed spool file on the first pass so that the assignment can see
    all lengths before any shard file is written; nothing is written under a final name until
    every check has passed.
    """
    shard_dir = Path(shard_dir)
    shard_dir.mkdir(parents=True, exist_ok=True)
    names = shard_names(n_shards)
    records, first_seen, costs, too_long, nucleotide = [], {}, [], [], {}
    # The spooled sequences, then the shard files (whose atomic writes name a full disk too).
    needed = 2 * estimated_text_bytes(inputs)
    with (
        naming_disk_full(shard_dir, needed),
        tempfile.TemporaryFile("w+", dir=shard_dir) as spool,
    ):
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
                if nucleotide_check and looks_nucleotide(record.sequence):
                    nucleotide.setdefault(str(path), []).append(record)
                kept = embedded_residues(length, truncation_seq_length, long_sequences)
                truncated = int(long_sequences == "truncate" and kept < length)
                records.append(
                    [len(records), record.id, None, length, kept, truncated]
                    + [record.n_replaced, record.source, record.header]
                )
                costs.append(record_cost(length, truncation_seq_length, long_sequences, embed_dim))
                spool.write(record.sequence + "\n")
        del first_seen
        _refuse_nucleotides(nucleotide)
        if too_long:
            raise FastaError(
                f"{len(too_long)} sequences are longer than truncation_seq_length ({truncation_seq_length}) "
                f"and long_sequences is 'fail': {'; '.join(too_long)}. Set long_sequences to truncate, "
                "chunk or skip, or remove them"
            )

        shard_of = assign(costs, n_shards)
        plan = [
            {"shard": name, "n_sequences": 0, "n_residues": 0, "estimated_cost": 0.0}
            for name in names
        ]
        for row, shard in zip(records, shard_of):
            row[2] = names[shard]
            plan[shard]["n_sequences"] += 1
            plan[shard]["n_residues"] += row[4]
            plan[shard]["estimated_cost"] += costs[row[0]]

        with ExitStack() as renamed_together:  # every shard file appears with the tables, or none
            tmp = [
                renamed_together.enter_context(atomic_path(shard_dir / f"{name}.tsv"))
                for name in names
            ]
            _write_shard_files(spool, records, shard_of, tmp)
    write_tsv(shard_dir / "records.tsv", RECORD_COLUMNS, records)
    write_tsv(shard_dir / "plan.tsv", PLAN_COLUMNS, [[p[c] for c in PLAN_COLUMNS] for p in plan])
    return plan


def _refuse_nucleotides(nucleotide: dict) -> None:
    if not nucleotide:
        return
    found = "; ".join(
        f"{path}: {len(recs)} records, e.g. '{recs[0].id}' ({recs[0].source})"
        for path, recs in nucleotide.items()
    )
    raise FastaError(
        f"nucleotide sequences where proteins are expected (records of at least {NUCLEOTIDE_MIN_LENGTH} "
        f"letters made only of {', '.join(NUCLEOTIDE_LETTERS)}): {found}. Give the protein FASTA "
        "(e.g. the gene caller's .faa), or set nucleotide_check: false to embed them as they are"
    )


def _write_shard_files(spool, records, shard_of, paths, files_at_once=256) -> None:
    """Distribute the spooled sequences, a block of shard files at a time (open-file limits)."""
    for first in range(0, len(paths), files_at_once):
        block = paths[first : first + files_at_once]
        with ExitStack() as stack:
            handles = [stack.enter_context(open(path, "w", newline="")) for path in block]
            writers = [csv.writer(fh, delimiter="\t", lineterminator="\n") for fh in handles]
            for writer in writers:
                writer.writerow(SHARD_COLUMNS)
            spool.seek(0)
            for row, shard, sequence in zip(records, shard_of, spool):
                if first <= shard < first + len(block):
                    writers[shard - first].writerow([row[0], row[1], sequence.rstrip("\n")])
