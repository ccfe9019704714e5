"""The shard step: read every input once, check it, find what the store already holds, and
split the rest into size-balanced shards.

Streaming: the first pass (esmshard.input.scan, in several processes) keeps 12 bytes per record
in memory (the length and a 64-bit hash of the ID), spools the sequences and the record table's
rows to temporary files, and each record's sequence key (esmshard.store) is spread over bucket
files; the buckets are then
matched one at a time against each other and against the store's keys. The second pass deals
the first record of each sequence that the store lacks out to the shard files. A shard file is
TSV, a header line `sequence_sha256  id  sequence`, then one sequence per line in input order.
"""

import logging
import os
import resource
import secrets
import time
from array import array
from collections.abc import Callable
from contextlib import ExitStack
from itertools import chain, islice
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pyarrow.parquet as pq

from ..compute.telemetry import peak_memory_mb
from ..embeddings_h5.id_index import id_hashes
from ..embeddings_h5.representations import absolute_layers
from ..files import (
    Buckets,
    DiskFullError,
    atomic_path,
    free_bytes,
    human_bytes,
    nearest_existing,
    read_tsv,
    temporary_folder,
    unwritable,
    write_json,
    write_tsv,
)
from ..input.balance import assign, embedded_residue_counts, forward_tokens, record_costs
from ..input.input_problems import InputProblems
from ..input.records import source, write_table
from ..input.scan import DIGESTS, HASHES, LENGTHS, SEQUENCES, TABLE, Found, Settings, scan
from ..input.sizing import ModelSize, auto_shard_count, estimated_text_bytes
from ..store import (
    KEY_BYTES,
    KEY_DTYPE,
    Store,
    StoreReadOnlyError,
    add_settings,
    read_json_object,
    settings_key,
)
from ..store.shardfile import output_bytes
from .shard_match import KeyBuckets, index_store, match_records, part_of_records

log = logging.getLogger(__name__)

SHARD_COLUMNS = ["sequence_sha256", "id", "sequence"]
PLAN_COLUMNS = ["shard", "n_sequences", "n_residues", "estimated_cost"]
PLAN_ID_BYTES = 6
KEYS_AT_ONCE = 1 << 20
SHA256_BYTES = np.dtype("S32")  # a digest as the first pass writes it
RUN_ENTRY = np.dtype([("key", KEY_DTYPE), ("value", np.int64)])  # value: the record's index


class Shard(NamedTuple):
    """One shard file's sequences: each with its key and the first record's ID."""

    keys: list[str]  # sequence_sha256, hex
    ids: list[str]
    sequences: list[str]


def plan_problem(layout, records=True) -> str | None:
    """What is wrong with a run's plan (shards/plan.tsv, plan.json and, with `records`, the
    record table: the shard step's outputs that the embed jobs and merge read; status reads the
    first two), if anything; None where it is whole. A run's start plans anew where it is not
    (esmshard.steps.start)."""
    damaged = "the plan is damaged: "
    summary = read_json_object(Path(layout.plan_json))
    if summary is None:
        return damaged + "shards/plan.json is missing or no JSON object"
    if not all(isinstance(summary.get(name), str) for name in ("store", "key")):
        return damaged + "shards/plan.json names no store and settings key"
    try:
        plan = read_tsv(layout.plan)
        if not all(row["shard"] and int(row["n_residues"]) >= 0 for row in plan):
            raise ValueError
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError):
        return damaged + "shards/plan.tsv is not the plan esmshard writes (cut short, or replaced)"
    computed = summary.get("computed", 0)
    if computed and not plan:
        return damaged + f"plan.json plans {computed} sequences, shards/plan.tsv no shard"
    if not records:
        return None
    try:
        pq.read_metadata(layout.records)
    except (OSError, ValueError):  # pyarrow's errors are both
        why = "missing" if not Path(layout.records).exists() else "not a Parquet file whole"
        return damaged + f"shards/records.parquet is {why}"
    return None


def read_shard(path) -> Shard:
    keys, ids, sequences = [], [], []
    with open(path) as fh:
        next(fh)  # the header line
        for line in fh:
            key, id_, sequence = line.rstrip("\n").split("\t")
            keys.append(key)
            ids.append(id_)
            sequences.append(sequence)
    return Shard(keys, ids, sequences)


def shard_step(settings: dict, model_size, **params):
    """The workflow's shard job: the model's weights first (a model that cannot be had stops the
    run before any shard work), then `write_shards`."""
    from ..models import ensure_available, parse_spec

    spec = parse_spec(settings["model"])
    ensure_available(spec)
    layers = len(absolute_layers(settings["repr_layers"], spec.num_layers))
    width = params.get("attention_values", (0, 0))[0]
    include, dim = settings["include"], model_size[1]

    def values_bytes(lengths) -> int:
        return output_bytes(
            lengths, layers, include, dim, {"attentions": width} if width else None
        )

    return write_shards(
        settings=settings, model_size=ModelSize(*model_size), values_bytes=values_bytes, **params
    )


class Embedded(NamedTuple):
    """The residues embedded of records (a slice or indices), and which are truncated: computed
    where needed, not kept for every record."""

    lengths: np.ndarray  # every record's, as read
    truncation_seq_length: int
    long_sequences: str

    def __call__(self, records) -> tuple[np.ndarray, np.ndarray]:
        read = self.lengths[records]
        kept = embedded_residue_counts(read, self.truncation_seq_length, self.long_sequences)
        if self.long_sequences != "truncate":
            return kept, np.zeros(read.size, bool)
        return kept, kept < read


class Cut(NamedTuple):
    """The new work cut into shards: the plan's id, the shards' names, each new record's shard
    and each shard's row of plan.tsv."""

    plan_id: str
    names: list[str]
    shard_of: np.ndarray
    plan: list[dict]


def write_shards(
    inputs,
    shard_dir,
    shards,
    truncation_seq_length: int,
    model_size: ModelSize,
    store_root,
    settings: dict,
    checksum_cache,
    long_sequences: str = "truncate",
    nucleotide_check: bool = True,
    slots: int | None = None,
    cluster: bool | None = None,
    workers: int = 1,
    attention_values: tuple[int, int] = (0, 0),
    values_bytes: Callable[[np.ndarray], int] | None = None,
    input_names: list[str] | None = None,
) -> dict:
    """Read every input once, check it, and write the shard files of the work the store lacks,
    the record table, `plan.tsv` (this run's shards) and `plan.json` (what the run reuses).

    `shards` is a number or "auto" (esmshard.input.sizing, from the new work and `slots`, the embed
    jobs that run at once, on a `cluster` or not), and `model_size`. Each sequence is computed
    once, whatever its IDs: the shard files hold
    the first record of each sequence that the store (`store_root`, embeddings made with
    `settings`) lacks. Nothing is written under a final name until every check has passed; the
    shard files, the record table and the plan appear together, as `shard_dir`, or none: a
    folder that exists is a finished step (Snakemake's own record of the job may be missing).

    `attention_values`: with attention maps, the values of a pair of residues and the bytes of
    one in embeddings.h5: their size is said, and refused before any embed job where the store's
    or the outdir's disk cannot hold it. `values_bytes`: the float32 values of sequences of some
    lengths, in bytes; plan.json then says what the new parts and every record's values take
    (what `esmshard plan` says of the disk). `store_root`: a folder, or a job's copy of an
    object store (a Store); `input_names`: the inputs' URLs where the step reads local copies.
    """
    shard_dir = Path(shard_dir)
    shard_dir.parent.mkdir(parents=True, exist_ok=True)
    store, key = Store.at(store_root), settings_key(settings)
    read_only = unwritable(store.root)  # a store for reuse alone, if it holds every sequence
    # The pieces' spooled sequences and rows, then the shard files.
    needed = 2 * estimated_text_bytes(inputs)
    with (
        atomic_path(shard_dir, needed) as building,
        temporary_folder(shard_dir.parent, "keys") as work,
    ):
        building.mkdir()
        run_keys = KeyBuckets(Path(work) / "run", RUN_ENTRY)
        scan_settings = Settings([str(path) for path in inputs], truncation_seq_length,
                                 long_sequences)  # fmt: skip
        scan = checked_scan(inputs, Path(work), run_keys, scan_settings, workers, nucleotide_check)
        lengths = np.frombuffer(scan.lengths, dtype=np.int32)
        embedded = Embedded(lengths, truncation_seq_length, long_sequences)
        set_aside = []
        stored, parts = index_store(store, key, run_keys, Path(work) / "store", set_aside)
        match = match_records(lengths.size, run_keys, stored, store, key, parts, checksum_cache,
                              set_aside)  # fmt: skip
        new = match.new_records
        if new.size and read_only:
            raise StoreReadOnlyError(store_lacks(store, match, read_only))
        log.info("sequences matched; peak memory so far %.0f MB", peak_memory_mb())
        cut = cut_into_shards(new, embedded, shards, settings, model_size, slots, cluster)
        if attention_values[0]:
            _attention_size(attention_values, embedded, new, cut, slots or 1, store,
                            shard_dir.parent)  # fmt: skip
        write_plan_files(building, scan, match, cut, parts, embedded)
        named = input_names or [str(Path(path).resolve()) for path in inputs]
        summary = plan_summary(named, store, key, scan, match, cut, scan_settings)
        # what `esmshard plan` says of the GPU time and the disk
        summary.update(model_params=model_size.params, slots=slots, cluster=cluster)
        if values_bytes is not None:
            summary["store_bytes"] = values_bytes(embedded(new)[0]) if new.size else 0
            summary["values_bytes"] = values_bytes(embedded(slice(None))[0])
        write_json(building / "plan.json", summary)
        if not read_only:
            add_settings(store, key, settings)
    log_plan(summary, store.folder(key), len(cut.names))
    return {**summary, "shards": cut.plan}


def log_plan(summary: dict, store_folder, n_shards: int) -> None:
    """Log what the plan reuses and computes, and what it does to long sequences."""
    log.info(
        "%d records, %d unique sequences: %d found in the store (%s), %d to compute in %d shards",
        *(summary[k] for k in ("records", "unique_sequences", "from_store")),
        store_folder,
        summary["computed"],
        n_shards,
    )
    if summary["long_said"]:
        log.warning("%s", summary["long_said"])


def store_lacks(store: Store, match, read_only: str) -> str:
    """Why a store that cannot be written cannot serve this run, and what to do."""
    return (
        f"the store {store.root} lacks {match.new_records.size} of the {match.n_unique} unique "
        f"sequences of this run, and {read_only}. Set `store` to a folder you can "
        "write (a copy of this one keeps what it holds), or make this one writable"
    )


def checked_scan(inputs, work: Path, run_keys, settings: Settings, workers, nucleotide_check):
    """Read every input (the first pass) and raise the problems it found, all of them at once."""
    scan = _scan(inputs, work / "pieces", run_keys, settings, workers)
    log.info(
        "%d records read by %d worker%s; peak memory so far %.0f MB (the largest worker "
        "process's: %.0f MB)",
        len(scan.lengths),
        workers,
        "s" if workers > 1 else "",
        peak_memory_mb(),
        resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
    )
    problems = scan.found.problems
    _find_duplicates(scan.id_hashes, [p / TABLE for p in scan.pieces], problems)
    del scan.id_hashes[:]
    if nucleotide_check:
        for path, (count, first_id, where) in scan.found.nucleotide.items():
            problems.add(
                "nucleotide", f"{path}: {count} records, e.g. '{first_id}' ({where})", count
            )
    problems.raise_if_any()
    return scan


def cut_into_shards(new, embedded: Embedded, shards, settings, model_size, slots, cluster) -> Cut:
    """Cut the new records into `shards` shards (or as many as `auto` finds) of equal cost."""
    # what the records cost: a pass per residue with masked marginals, a chunked record's
    # windows each
    limit, long_sequences = embedded.truncation_seq_length, embedded.long_sequences
    include = settings.get("include", ())
    recipe = settings.get("score_windows", "weighted")
    read = embedded.lengths[new]
    costs = record_costs(read, limit, long_sequences, model_size.dim, include, recipe)
    tokens = forward_tokens(read, limit, long_sequences, include, recipe)
    n_shards = min(
        new.size,
        auto_shard_count(tokens, model_size.params, slots or 1, bool(cluster))
        if shards == "auto"
        else shards,
    )
    plan_id = secrets.token_hex(PLAN_ID_BYTES)  # unique among every run using the store
    names = [f"{plan_id}-{k:04d}" for k in range(n_shards)]
    shard_of = assign(costs, n_shards) if n_shards else np.zeros(0, dtype=np.int32)
    return Cut(plan_id, names, shard_of, _plan(names, shard_of, embedded(new)[0], costs))


def write_plan_files(building: Path, scan: "Scan", match, cut: Cut, parts, embedded) -> None:
    """Write the shard files, the record table and plan.tsv into the step's folder."""
    part_of = part_of_records(match, cut.shard_of, len(parts))
    _deal_out(
        [p / SEQUENCES for p in scan.pieces],
        match.new_records,
        cut.shard_of,
        [building / f"{name}.tsv" for name in cut.names],
    )
    write_table(
        [p / TABLE for p in scan.pieces],
        building / "records.parquet",
        parts + cut.names,
        part_of,
        embedded,
    )
    rows = [[p[c] for c in PLAN_COLUMNS] for p in cut.plan]
    write_tsv(building / "plan.tsv", PLAN_COLUMNS, rows)


def plan_summary(
    inputs: list[str], store, key, scan: "Scan", match, cut: Cut, settings: Settings
) -> dict:
    """plan.json: what the run reuses from the store and computes, and its long records; the
    inputs and the store as the user names them (in object storage: their URLs)."""
    new = int(match.new_records.size)
    return {
        "plan": cut.plan_id,
        "planned_at": time.time(),  # the run's start, whichever command finishes it
        "store": store.url or str(Path(store.root).resolve()),
        "inputs": inputs,
        # store parts that failed their check, set aside: their sequences are computed again
        "set_aside": match.set_aside,
        "key": key,
        "records": len(scan.lengths),
        "unique_sequences": match.n_unique,
        "from_store": match.n_unique - new,
        "computed": new,
        # records beyond truncation_seq_length, and what long_sequences does with them
        "long_records": scan.found.long.count,
        "long_sequences": settings.long_sequences,
        "long_said": scan.found.long.said(settings.truncation_seq_length, settings.long_sequences),
    }


def _attention_size(
    attention_values, embedded: Embedded, new, cut: Cut, slots: int, store: Store, outdir: Path
) -> None:
    """Say what the attention maps will take (L² values of each protein: they dwarf the rest),
    and refuse them where the disks cannot hold them at their peak: every shard's part, and
    while a job makes its part of its kept pieces, both (for the `slots` largest shards, the
    jobs that run at once)."""
    width, itemsize = attention_values
    pairs = embedded(new)[0].astype(np.int64) ** 2
    n_shards = len(cut.names)
    shard_pairs = np.bincount(cut.shard_of, weights=pairs, minlength=n_shards).astype(np.int64)
    in_store = 4 * width * int(shard_pairs.sum())  # float32, as computed
    largest = np.sort(shard_pairs)[::-1][:slots]
    in_pieces = 4 * width * int(largest.sum())  # kept pieces beside their part, at once
    in_output = itemsize * width * int((embedded(slice(None))[0].astype(np.int64) ** 2).sum())
    log.warning(
        "attention maps: %s in the store (float32) for the %s to compute, about %s in "
        "embeddings.h5",
        human_bytes(in_store),
        "1 sequence" if new.size == 1 else f"{new.size:,} sequences",
        human_bytes(in_output),
    )
    same_disk = (
        os.stat(nearest_existing(store.root)).st_dev == os.stat(nearest_existing(outdir)).st_dev
    )
    # merge writes embeddings.h5 once every job has ended, its pieces removed
    needs = (
        [(store.root, in_store + max(in_pieces, in_output))]
        if same_disk
        else [(store.root, in_store + in_pieces), (str(outdir), in_output)]
    )
    for folder, needed in needs:
        free = free_bytes(folder)
        if needed > free:
            if folder == store.root:
                more = needed - in_store
                to_merge = same_disk and in_output >= in_pieces
                what = "embeddings.h5" if to_merge else "kept pieces beside their parts"
                needed_as = (
                    f" (the store's {human_bytes(in_store)}, then {human_bytes(more)} of {what})"
                )
            else:
                needed_as = " (embeddings.h5)"
            raise DiskFullError(
                f"the attention maps need {human_bytes(needed)} at {folder}{needed_as}, where "
                f"{human_bytes(free)} is free: keep fewer layers (attention_layers), their mean "
                "(attention_heads: mean), or fewer or shorter proteins; or give the store and "
                "outdir a larger disk"
            )


class Scan(NamedTuple):
    """What the first pass keeps of every record, what it found, and the pieces' folders (their
    spooled sequences and record table rows, in input order)."""

    lengths: array
    id_hashes: array
    found: Found
    pieces: list[Path]


def _scan(inputs, folder, run_keys, settings: Settings, workers: int) -> Scan:
    """The first pass (esmshard.input.scan), its pieces gathered in input order: each record's
    key to `run_keys` with its index, its length and ID hash kept."""
    found, lengths, hashes, pieces = Found(), array("i"), array("q"), []
    for piece in scan(inputs, folder, settings, workers):
        start = found.n_records
        with open(piece.folder / DIGESTS, "rb") as fh:
            while (digests := np.fromfile(fh, SHA256_BYTES, KEYS_AT_ONCE)).size:
                # a sequence's key: its digest's first KEY_BYTES (esmshard.store)
                keys = digests.view(np.uint8).reshape(-1, 32)[:, :KEY_BYTES].copy()
                run_keys.add(keys.view(KEY_DTYPE).ravel(), np.arange(start, start + len(keys)))
                start += len(keys)
        for values, name in ((lengths, LENGTHS), (hashes, HASHES)):
            with open(piece.folder / name, "rb") as fh:
                values.fromfile(fh, piece.found.n_records)
        for name in (DIGESTS, LENGTHS, HASHES):
            os.unlink(piece.folder / name)
        found.extend(piece.found)
        pieces.append(piece.folder)
    run_keys.flush()
    return Scan(lengths, hashes, found, pieces)


def _find_duplicates(hashes: array, tables, problems: InputProblems) -> None:
    """IDs must be unique: equal hashes are looked up in the pieces' record tables, by name."""
    hashes = np.frombuffer(hashes, dtype=np.int64)
    hashes.sort()  # in place: the hashes are not needed in input order again
    suspects = np.unique(hashes[1:][hashes[1:] == hashes[:-1]])
    del hashes
    if not suspects.size:
        return
    first_seen = {}
    for table in tables:
        for batch in pq.ParquetFile(table).iter_batches(columns=["id", "file", "line"]):
            ids = batch.column("id").to_pylist()
            for k in np.flatnonzero(np.isin(id_hashes(ids).view(np.int64), suspects)).tolist():
                id_ = ids[k]
                where = source(batch.column("file")[k].as_py(), batch.column("line")[k].as_py())
                if id_ in first_seen:
                    problems.add("duplicate_id", f"'{id_}' at {first_seen[id_]} and at {where}")
                else:
                    first_seen[id_] = where


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


def _deal_out(sequences, new_records, shard_of, paths, records_at_once: int = 1 << 20) -> None:
    """The second pass: each planned record's spooled line (in the `sequences` files, in input
    order) to its shard's file, in input order."""
    for path in paths:
        Path(path).write_bytes(("\t".join(SHARD_COLUMNS) + "\n").encode())
    buckets = Buckets(paths)
    add = buckets.add
    with ExitStack() as files:
        lines = chain.from_iterable(files.enter_context(open(path, "rb")) for path in sequences)
        position = 0  # the spooled line `lines` is at
        for start in range(0, new_records.size, records_at_once):
            chosen = new_records[start : start + records_at_once].tolist()
            for index, shard in zip(chosen, shard_of[start : start + records_at_once].tolist()):
                add(shard, next(islice(lines, index - position, None)))
                position = index + 1
    buckets.flush()
