"""The neighbours steps: the run's proteins (the queries) against a reference cut into shards of
rows, one job per shard, each writing its queries' top k; then their merge into the tables
(esmshard.outputs.nearest). A part's file appears whole once its job is done, so a killed job
is the only one the same command runs again.
"""

import logging
import time
from pathlib import Path
from typing import NamedTuple

import numpy as np

from ..compute import pool
from ..files import atomic_path, write_json
from ..layout import NeighbourPart
from ..outputs import nearest as found
from ..outputs.nearest import INDEX_FOLDER
from ..outputs.nearest_terms import Carry, carried_terms, carry_asked
from ..outputs.per_protein import open_reference, unrecorded_line
from ..outputs.reader import Embeddings, embeddings_file
from ..search import Hits, merged
from ..search.annotations import unmatched_line
from ..search.approximate import IndexUse
from ..search.transfer import (
    TransferAsked,
    write_transfer,
)
from ..store.runlock import current_run

log = logging.getLogger(__name__)


def part_names(parts: int) -> list[str]:
    return [NeighbourPart(i, parts).name for i in range(parts)]


def rows_of(part: str, n_rows: int) -> tuple[int, int]:
    """The reference rows of `part` ("i-of-n"): n ranges of sizes that differ by one at most."""
    i, n = NeighbourPart.named(part)
    return i * n_rows // n, (i + 1) * n_rows // n


class Search(NamedTuple):
    """What a search is asked: the neighbours per protein, the metric, the mean layer compared
    (a number, or `last`'s) and the reference as the config names it (`self`, a path)."""

    k: int
    metric: str
    layer: int
    reference: str
    extra: int = 0  # searched past k: goPredSim's transfer counts the hits tied with the k-th
    index: str = "exact"  # or an approximate index's kind (esmshard.search.approximate)


class PartProgress:
    """A search job's reference rows done, written every few seconds for `esmshard status`."""

    EVERY_SECONDS = 2.0

    def __init__(self, path, part: str, rows: int):
        self.path, self.part, self.rows = path, part, rows
        self.started = self.written = time.time()
        self.write(0)

    def write(self, done: int) -> None:
        write_json(self.path, {"part": self.part, "rows": self.rows, "done": done,
                               "started_at": self.started, "updated_at": time.time()})  # fmt: skip

    def __call__(self, done: int) -> None:
        if time.time() - self.written >= self.EVERY_SECONDS:
            self.written = time.time()
            self.write(done)


def search_part(
    queries_h5, reference_h5, out_npz, metrics_json, part: str, search: Search, gpus="auto",
    run_lock=None, annotations=None, transfer: TransferAsked | None = None,
):  # fmt: skip
    """Each query's `search.k` nearest rows among the reference's rows of `part`, the products
    on the GPU the job holds from the pool (esmshard.compute.pool), or on the CPU without one;
    its rows done as it goes (esmshard status); the job's figures, the search's settings and
    the command that ran it (`run_lock`'s) in `metrics_json` (for the scaling report), written
    first. With `transfer`'s ontology, each aspect is searched again among the references
    that `annotations` gives terms of it (`rows_BPO`, ... beside `rows`)."""
    itself = Path(queries_h5).resolve() == Path(reference_h5).resolve()
    remove_other_searches(Path(out_npz).parent, part)
    progress_json = Path(out_npz).with_suffix(".progress.json")
    with (
        pool.acquire(pool.pool_devices(gpus), job=f"neighbours {part}") as slot,
        Embeddings(queries_h5) as queries,
        open_reference(reference_h5) as reference,
    ):
        device = search_device(slot)
        chosen = found.comparable_layer(queries, reference, search.layer)
        rows = rows_of(part, len(reference))
        vectors = np.asarray(queries.array("mean", chosen), dtype=np.float32)
        not_numbers = found.not_numbers_line(vectors, queries)
        if not_numbers and NeighbourPart.named(part).index == 0:  # one part says it for all
            log.warning(not_numbers)
        own = np.arange(len(queries)) if itself else None
        k = min(usable_k(search.k, len(reference), itself) + search.extra,
                max(len(reference) - itself, 1))  # fmt: skip
        subsets = {"": None}
        if transfer is not None and transfer.ontology:
            subsets.update(aspect_rows(reference.ids(), annotations, transfer))
        progress = PartProgress(progress_json, part, (rows[1] - rows[0]) * len(subsets))
        folders = index_folders(reference_h5, out_npz, itself)
        started = time.perf_counter()
        searched = {name: found.searched_by(
            found.index_asked(search.index, reference, rows, name, folders), vectors, reference,
            chosen, k, search.metric, own, rows, device, allowed=allowed,
            on_block=lambda done, i=i: progress(i * (rows[1] - rows[0]) + done),
        ) for i, (name, allowed) in enumerate(subsets.items())}  # fmt: skip
        seconds = time.perf_counter() - started
    hits = {name: done.hits for name, done in searched.items()}
    used = searched[""].index
    log.info("part %s on %s: reference rows %d to %d against %d queries in %.1f s%s",
             part, device, *rows, len(vectors), seconds,
             f", by {used.line()}" if used else "")  # fmt: skip
    command = current_run(run_lock) if run_lock else {}
    searched_rows = rows[1] - rows[0]
    write_json(metrics_json, {
        "part": part, "device": device, "reference_rows": searched_rows, "queries": len(vectors),
        "seconds": round(seconds, 3), "rows_per_second": round(searched_rows / max(seconds, 1e-9)),
        **search._asdict(), "layer": chosen, **index_figures(used), "finished_at": time.time(),
        "command": command.get("typed_command") or command.get("command"),
    })  # fmt: skip
    arrays = {f"{kind}_{name}".rstrip("_"): getattr(h, kind) for name, h in hits.items()
              for kind in ("rows", "distances")}  # fmt: skip
    with atomic_path(out_npz) as tmp, open(tmp, "wb") as fh:
        np.savez(fh, **arrays, layer=chosen, index=used.kind if used else "exact",
                 recall=used.recall if used else np.nan)  # fmt: skip
    progress_json.unlink(missing_ok=True)


def index_folders(reference_h5, out_npz, itself: bool) -> tuple:
    """Where a part's index is kept: beside the reference (its file's folder) or, where that
    cannot be written and for `self`, in the run's `neighbours/index`."""
    run_folder = Path(out_npz).parent / "index"
    return (run_folder,) if itself else (Path(reference_h5).parent / INDEX_FOLDER, run_folder)


def index_figures(used: IndexUse | None) -> dict:
    """How a part was searched, for its figures and its hits' file."""
    if used is None:
        return {"index": "exact"}
    return {"index": used.kind, "recall": used.recall, "recall_sample": used.sample,
            "index_setting": used.setting, "index_built": used.built,
            "index_build_seconds": used.build_seconds, "index_file": used.path}  # fmt: skip


# What a search job writes in the neighbours folder: its top k, figures and progress
PART_FILES = (".npz", ".json", ".progress.json")


def remove_other_searches(folder: Path, part: str) -> None:
    """Remove the files of a search cut into another number of parts (an earlier command's,
    which no later step reads), so that `esmshard status` counts this search's alone: only
    names a search job writes ("i-of-n" and one of PART_FILES)."""
    count = NeighbourPart.named(part).count
    for path in folder.glob("*-of-*.*"):
        stem, dot, suffix = path.name.partition(".")
        other = NeighbourPart.named(stem)
        if other is not None and other.count != count and dot + suffix in PART_FILES:
            path.unlink(missing_ok=True)


def usable_k(k: int, n_reference: int, itself: bool) -> int:
    """`k`, or the proteins the reference holds (said in the log) where it holds fewer."""
    available = n_reference - (1 if itself else 0)
    if k > available:
        log.warning("neighbours_k = %d, but the reference holds %d proteins%s: each protein "
                    "gets %d", k, n_reference, " (its own left out)" if itself else "",
                    max(available, 0))  # fmt: skip
    return max(min(k, available), 1)


def search_device(slot) -> str:
    """A GPU slot's CUDA device where torch can use it, else the CPU (torch's top k there is
    about 2.5 times numpy's partition)."""
    import torch

    return "cuda" if slot.cuda_visible_devices and torch.cuda.is_available() else "cpu"


def write_neighbours(
    parts, queries_h5, reference_h5, reference_name, annotations, tables, k, metric, unwritten=(),
    transfer=None, transfer_files=(),
):  # fmt: skip
    """Merge the parts' top k and write the tables; the annotations' IDs absent from the
    reference are counted in the log. `unwritten`: an earlier search's tables that this one
    does not write (its annotations.tsv, where this one has none), removed: each table is
    this search's. `transfer` (TransferAsked): the terms carried goPredSim's way, to
    `transfer_files` (TSV, Parquet)."""
    loaded = [np.load(path) for path in parts]
    carry = carry_of(annotations, transfer)
    table = carry.annotations
    with Embeddings(queries_h5) as queries, open_reference(reference_h5) as reference:
        query_ids, reference_ids = queries.ids(), reference.ids()
        card = {"model": queries.made_by.get("model"), "layer": int(loaded[0]["layer"]),
                "metric": metric, "reference": reference_name, "k": k,
                **index_card(loaded)}  # fmt: skip
        unrecorded = unrecorded_line(reference)
    searched = merged_parts(loaded)
    hits = Hits(searched.rows[:, :k], searched.distances[:, :k])
    unmatched = unmatched_line(table, reference_ids, annotations, "the reference")
    for line in (unrecorded, unmatched):
        if line:
            log.warning(line)
    for path in unwritten:
        if Path(path).is_file():
            Path(path).unlink()
            log.info("removed %s, an earlier search's: this one does not write it", path)
    found.write_tables(tables, hits, query_ids, reference_ids, table, metric, card)
    if carry.transfer is not None:
        if carry.unknown:
            log.warning(carry.unknown)
        aspects = {aspect: merged_parts(loaded, f"_{aspect}")
                   for aspect in carry.aspects}  # fmt: skip
        carried = carried_terms(carry, searched, aspects, query_ids, reference_ids, metric)
        write_transfer(*transfer_files, carried, {**card, **carry.transfer.card(carry.ontology)})
        log.info("carried %d terms of %s to %d of %d proteins", len(carried), transfer.column,
                 len({t.id for t in carried}), len(query_ids))  # fmt: skip


def index_card(loaded) -> dict:
    """How the parts were searched: `index` (exact, or the kind of approximate index) and, for
    an approximate one, `recall_at_k`, the lowest of the parts' measured recalls."""
    kinds = sorted({str(p["index"]) if "index" in p else "exact" for p in loaded})
    recalls = [float(p["recall"]) for p in loaded if "recall" in p and np.isfinite(p["recall"])]
    card = {"index": "+".join(kinds)}
    return {**card, "recall_at_k": min(recalls)} if recalls else card


def merged_parts(loaded, suffix: str = "") -> Hits:
    """The search parts' hits merged (`suffix`: an aspect's, `_BPO`, ...): each part holds k
    (or the reference's proteins, where fewer) and the extra searched."""
    parts = [Hits(p[f"rows{suffix}"], p[f"distances{suffix}"]) for p in loaded]
    return merged(parts, max(h.rows.shape[1] for h in parts))


def carry_of(annotations, transfer: TransferAsked | None) -> Carry:
    """What the search carries, read and checked as `esmshard neighbours` and
    `Embeddings.nearest` read it (esmshard.outputs.nearest_terms)."""
    if transfer is None:
        return carry_asked(annotations)
    return carry_asked(annotations, transfer.column, transfer.max_distance, transfer.ontology,
                       transfer.k)  # fmt: skip


def aspect_rows(reference_ids, annotations, transfer: TransferAsked) -> dict[str, np.ndarray]:
    """Which reference rows each aspect searches: those with a term of it."""
    return carry_of(annotations, transfer).aspect_rows(reference_ids)


SELF = "self"  # `neighbours: self`: the run's proteins against each other
LAST = "last"  # `neighbours_layer: last`: the last of repr_layers
ROWS_PER_PART = 1 << 20  # `neighbours_shards: auto`: a part per million reference rows


def reference_file(setting: str, run_embeddings: str) -> str:
    """The reference's embeddings.h5: the run's own for `self`, else the file or the outdir's."""
    if setting == SELF:
        return run_embeddings
    return str(embeddings_file(setting)) if Path(setting).is_dir() else setting


def parts_of(setting, reference_rows: int) -> int:
    """How many parts the reference is cut into: `neighbours_shards`, or one a million rows."""
    return setting if isinstance(setting, int) else max(1, -(-reference_rows // ROWS_PER_PART))


def transfer_asked(config: dict) -> TransferAsked | None:
    """How `neighbours_terms` carries terms (esmshard.search.transfer), or None without it."""
    if not config.get("neighbours_terms"):
        return None
    distance = config["neighbours_transfer"] == "distance"
    return TransferAsked(config["neighbours_terms"], config["neighbours_k"],
                         config["neighbours_max_distance"] if distance else None,
                         config.get("neighbours_ontology") or None)  # fmt: skip


def stored_rows(path) -> int:
    """The proteins an embeddings.h5 (or a per-protein HDF5) holds."""
    with open_reference(path) as emb:
        return len(emb)
