"""Merging the parts that hold a run's sequences into one HDF5 file in input order, with the
list of failed records.

The parts are shard files (esmshard.store.shardfile) of this run and of the store; each record's
part is in the record table, and its row there is found by its sequence's key. Streaming, with
memory bounded apart from 9 to 30 bytes per record (status, length and row in its part; the
output row; the per-residue and contact offsets where included): the record table is read once
into a file of records per part (PartMembers), each part's records are checked and copied a
chunk at a time, its rows read in blocks and placed by their rows in the output; the output is
built a window of rows at a time (WINDOW_BYTES), through spill files when it has more than one
window, and each window is written at once. With `output_values: in_place`, where each
protein's values are is written instead of a copy (esmshard.embeddings_h5.in_place).
"""

import json
import logging
import time
from pathlib import Path

import numpy as np

from ..compute import provenance
from ..embeddings_h5.representations import SQUARE, TRIANGLE
from ..files import temporary_folder, write_json, write_tsv
from ..input.records import source
from ..store import Store, settings_key
from ..store.runlock import current_run
from ..version import __version__
from .merge_output import Output
from .merge_rows import PartMembers, record_rows
from .merge_scan import MergeError, Scan, Shapes, output_shapes, scan_parts
from .progress import read_metrics

log = logging.getLogger(__name__)

FAILED_COLUMNS = ["id", "source", "reason"]
# The representations' type in embeddings.h5: float16 halves the file; its values are read
# back within a relative 2**-11 (half a unit in the last place), and larger than 65504 refused.
OUTPUT_DTYPES = {"float32": np.float32, "float16": np.float16}
# output_values: auto leaves the values in place when a copy would be larger than this.
AUTO_IN_PLACE_BYTES = 100 << 30


def merge(
    records,
    plan_json,
    store_root,
    out_h5,
    failed_tsv,
    run_json,
    settings: dict,
    checksum_cache,
    output_dtype: str = "float32",
    per_residue_compression: str = "none",
    contacts_dtype: str = "float16",
    metrics_files=(),
    run_lock: str | None = None,
    output_values: str = "copy",
) -> dict:
    """Stream the parts that hold the run's sequences into `out_h5`, every record in input order
    (records with one sequence get the same rows); every record lands there or in `failed_tsv`.

    The parts are this run's shards and the store's (`store_root`: a folder, or a job's copy of
    an object store, esmshard.store), as
    `plan_json` and the record table say. Each must be the part it is named as, computed with
    `settings` (the run's embedding settings), and hold its records' sequences: anything else
    is set aside and refused by name rather than merged into a wrong answer. `run_json` gets the
    run's counts: `computed` by the plan, and `computed_by_this_command`, the sequences of the
    shards whose metrics (`metrics_files`) carry the run id of the command now running (the
    holder of `run_lock`, as esmshard.store.runlock.current_run records it: also its command
    line, folder and start, which run.json names).

    `output_values`: `copy` writes the representations into `out_h5`; `in_place` writes where
    each protein's are in the parts instead (esmshard.embeddings_h5.in_place); `auto`, in place when they
    would pass AUTO_IN_PLACE_BYTES.
    """
    plan = json.loads(Path(plan_json).read_text())
    store, key = Store.at(store_root), plan["key"]
    if settings_key(settings) != key:
        raise MergeError(
            f"{plan_json} was planned with other embedding settings than this run's; delete "
            f"{Path(plan_json).parent} and run the same command again"
        )
    with temporary_folder(Path(out_h5).parent, "merge-spill") as spill_dir:
        members = PartMembers(spill_dir, records)
        scan = scan_parts(members, store, key, plan["plan"], records, checksum_cache)
        dtype = OUTPUT_DTYPES[output_dtype]
        shapes = output_shapes(scan, settings["include"], dtype, contacts_dtype)
        in_place = output_values == "in_place" or (
            output_values == "auto" and shapes.size() > AUTO_IN_PLACE_BYTES
        )
        card = provenance.made_by(settings, key, ",".join(sorted(scan.precisions)), checksum_cache)
        attrs = output_attributes(scan, shapes, card, settings, output_dtype, in_place,
                                  per_residue_compression, contacts_dtype)  # fmt: skip
        output = Output(out_h5, records, spill_dir, per_residue_compression, in_place, store)
        output.write(scan, shapes, members, attrs)
    write_failed(failed_tsv, records, scan.failures)
    # where embeddings.h5's values are: in the file, or in the store's parts
    values_at = {"output_values": "in_place" if in_place else "copy",
                 "store": store.url or str(Path(store.root).resolve())}  # fmt: skip
    counts = run_counts(plan, scan, shapes, settings, card, metrics_files, run_lock, values_at)
    write_json(run_json, counts)
    log.info(
        "%d records, %d unique sequences: %d computed (%d by this command, %d kept from stopped "
        "jobs), %d from the store; %d records failed",
        counts["records"],
        counts["unique_sequences"],
        counts["computed"],
        counts["computed_by_this_command"],
        counts["kept_from_stopped_jobs"],
        counts["from_store"],
        counts["failed"],
    )
    return counts


def output_attributes(
    scan: Scan, shapes: Shapes, card, settings, output_dtype, in_place, compression, contacts_dtype
) -> dict:
    """embeddings.h5's attributes: the run's card (esmshard.compute.provenance), its counts and
    settings, and how the values are held."""
    attrs = {name: -1 if value is None else value for name, value in card.items()}
    attrs.update(
        truncation_seq_length=scan.attrs["truncation_seq_length"],
        n_embedded=shapes.n_embedded,
        n_failed=len(scan.failures),
        settings=json.dumps(settings),
        output_dtype=output_dtype,
        output_values="in_place" if in_place else "copy",
        per_residue_compression=compression,
        contacts_dtype=contacts_dtype
        if any(k.rows in (TRIANGLE, SQUARE) for k in shapes.unlayered)
        else "",
        **provenance.attributes(scan.computed_rows),
    )
    return attrs


def write_failed(failed_tsv, records, failures: dict) -> None:
    """Write failed.tsv: each failed record's ID, source and reason, in input order."""
    failed = sorted(failures)
    rows = record_rows(records, ["id", "file", "line"], failed)
    write_tsv(
        failed_tsv,
        FAILED_COLUMNS,
        [[id_, source(file, line), failures[i]] for i, (id_, file, line) in zip(failed, rows)],
    )


def run_counts(
    plan, scan: Scan, shapes: Shapes, settings, card, metrics_files, run_lock, values_at: dict
) -> dict:
    """run.json's counts: the records and where their sequences came from, where the values
    are (`values_at`), the command that merged, and how the parts were computed."""
    command = current_run(run_lock) if run_lock else {}
    run_id = command.get("run_id")
    return {
        "records": int(scan.status.size),
        "unique_sequences": plan["unique_sequences"],
        "computed": plan["computed"],
        **_computed_by(metrics_files, run_id),
        "run_id": run_id,
        "from_store": plan["from_store"],
        # store parts that failed their check in the shard step, their sequences recomputed
        "set_aside": plan.get("set_aside", []),
        "embedded": shapes.n_embedded,
        "failed": len(scan.failures),
        **values_at,
        # records beyond truncation_seq_length, by what long_sequences did with them
        "inputs": plan.get("inputs", []),
        # the command that merged: its command line, folder, start, and the merge's end
        "command": command.get("command"),
        "typed_command": command.get("typed_command"),
        "workdir": command.get("workdir"),
        "started_at": command.get("started_at"),
        "planned_at": plan.get("planned_at"),  # the run's first command planned it
        "finished_at": time.time(),
        "long_records": plan.get("long_records", 0),
        "long_sequences": plan.get("long_sequences", settings["long_sequences"]),
        "long_said": plan.get("long_said", ""),
        "made_by": card,
        "esmshard_version": __version__,
        "precisions": sorted(scan.precisions),
        "devices": sorted({row["device_name"] for row in scan.computed_rows}),
        "computed_with": scan.computed_rows,
    }


def _computed_by(metrics_files, run_id) -> dict[str, int]:
    """The sequences that the command `run_id`'s jobs computed themselves, and those that
    stopped jobs (of any command) kept and no later job computed again (esmshard.store.pieces)."""
    metrics = [read_metrics(path) for path in metrics_files]

    def kept(m):
        return m.get("kept_sequences", 0) if isinstance(m.get("kept_sequences"), int) else 0

    return {
        "computed_by_this_command": sum(
            m["n_sequences"] - kept(m) for m in metrics if run_id and m.get("run_id") == run_id
        ),
        "kept_from_stopped_jobs": sum(kept(m) for m in metrics),
        # the same in residues, the unit of the progress and the report
        "residues_kept_from_stopped_jobs": sum(
            m["kept_residues"] for m in metrics if isinstance(m.get("kept_residues"), int)
        ),
    }
