"""The neighbours steps: the run's proteins (the queries) against a reference cut into shards of
rows, one job per shard, each writing its queries' top k; then their merge into the tables
(esmshard.outputs.nearest). A part's file appears whole once its job is done, so a killed job
is the only one the same command runs again.
"""

import logging
import time
from pathlib import Path

import numpy as np

from ..compute import pool
from ..files import atomic_path, write_json
from ..layout import NeighbourPart
from ..outputs import nearest as found
from ..outputs.reader import Embeddings
from ..search import Hits, merged

log = logging.getLogger(__name__)


def part_names(parts: int) -> list[str]:
    return [NeighbourPart(i, parts).name for i in range(parts)]


def rows_of(part: str, n_rows: int) -> tuple[int, int]:
    """The reference rows of `part` ("i-of-n"): n ranges of sizes that differ by one at most."""
    i, n = NeighbourPart.named(part)
    return i * n_rows // n, (i + 1) * n_rows // n


def search_part(
    queries_h5, reference_h5, out_npz, metrics_json, part: str, k: int, metric: str, layer,
    gpus="auto",
):  # fmt: skip
    """Each query's `k` nearest rows among the reference's rows of `part`, the products on the
    GPU the job holds from the pool (esmshard.compute.pool), or on the CPU without one; the
    job's figures in `metrics_json` (for the scaling report), written first."""
    itself = Path(queries_h5).resolve() == Path(reference_h5).resolve()
    with (
        pool.acquire(pool.pool_devices(gpus), job=f"neighbours {part}") as slot,
        Embeddings(queries_h5) as queries,
        Embeddings(reference_h5) as reference,
    ):
        device = search_device(slot)
        chosen = found.comparable_layer(queries, reference, layer)
        rows = rows_of(part, len(reference))
        vectors = np.asarray(queries.array("mean", chosen), dtype=np.float32)
        own = np.arange(len(queries)) if itself else None
        started = time.perf_counter()
        hits = found.search(vectors, reference, chosen, k, metric, own, rows, device)
        seconds = time.perf_counter() - started
        say_k_past(k, len(reference), itself)
    searched = rows[1] - rows[0]
    log.info("part %s on %s: reference rows %d to %d against %d queries in %.1f s",
             part, device, *rows, len(vectors), seconds)  # fmt: skip
    write_json(metrics_json, {
        "part": part, "device": device, "reference_rows": searched, "queries": len(vectors),
        "seconds": round(seconds, 3), "rows_per_second": round(searched / max(seconds, 1e-9)),
    })  # fmt: skip
    with atomic_path(out_npz) as tmp, open(tmp, "wb") as fh:
        np.savez(fh, rows=hits.rows, distances=hits.distances, layer=chosen)


def say_k_past(k: int, n_reference: int, itself: bool) -> None:
    available = n_reference - (1 if itself else 0)
    if k > available:
        log.warning("neighbours_k = %d, but the reference holds %d proteins%s: each protein "
                    "gets %d", k, n_reference, " (its own left out)" if itself else "",
                    max(available, 0))  # fmt: skip


def search_device(slot) -> str:
    """A GPU slot's CUDA device where torch can use it, else the CPU (torch's top k there is
    about 2.5 times numpy's partition)."""
    import torch

    return "cuda" if slot.cuda_visible_devices and torch.cuda.is_available() else "cpu"


def write_neighbours(
    parts, queries_h5, reference_h5, reference_name, annotations, tables, k, metric
):
    """Merge the parts' top k and write the tables; the annotations' IDs absent from the
    reference are counted in the log."""
    loaded = [np.load(path) for path in parts]
    hits = merged([Hits(p["rows"], p["distances"]) for p in loaded], k)
    table = found.read_annotations(annotations) if annotations else {}
    with Embeddings(queries_h5) as queries, Embeddings(reference_h5) as reference:
        query_ids, reference_ids = queries.ids(), reference.ids()
        card = {"model": queries.made_by.get("model"), "layer": int(loaded[0]["layer"]),
                "metric": metric, "reference": reference_name, "k": k}  # fmt: skip
    unmatched = found.unmatched_line(table, reference_ids, annotations, "the reference")
    if unmatched:
        log.warning(unmatched)
    found.write_tables(tables, hits, query_ids, reference_ids, table, metric, card)


SELF = "self"  # `neighbours: self`: the run's proteins against each other
LAST = "last"  # `neighbours_layer: last`: the last of repr_layers
ROWS_PER_PART = 1 << 20  # `neighbours_shards: auto`: a part per million reference rows


def reference_file(setting: str, run_embeddings: str) -> str:
    """The reference's embeddings.h5: the run's own for `self`, else the file or the outdir's."""
    if setting == SELF:
        return run_embeddings
    path = Path(setting)
    return str(path / "embeddings.h5") if path.is_dir() else setting


def parts_of(setting, reference_rows: int) -> int:
    """How many parts the reference is cut into: `neighbours_shards`, or one a million rows."""
    return setting if isinstance(setting, int) else max(1, -(-reference_rows // ROWS_PER_PART))


def neighbour_problems(config: dict) -> list[str]:
    """Why the neighbours keys cannot run as given, one line each."""
    setting, annotations = config["neighbours"], config["neighbours_annotations"]
    if not setting:
        return ["neighbours_annotations: needs neighbours (the reference to search)"] * bool(
            annotations
        )
    problems = []
    if setting != SELF and not Path(reference_file(setting, "")).is_file():
        problems.append(
            f"neighbours: {setting} is neither an embeddings.h5 nor an outdir that holds one: "
            "give the reference's (embedded with the same model), or self"
        )
    if "mean" not in config["include"]:
        problems.append("neighbours: the search compares mean embeddings: add mean to include")
    layer = config["neighbours_layer"]
    if layer != LAST and layer not in config["repr_layers"]:
        problems.append(
            f"neighbours_layer: {layer} is not one of repr_layers {config['repr_layers']}: "
            "add it there"
        )
    if annotations and not Path(annotations).is_file():
        problems.append(
            f"neighbours_annotations: {annotations} does not exist: give a CSV or TSV with an "
            "`id` column and the columns to carry over"
        )
    return problems


def stored_rows(path) -> int:
    """The proteins an embeddings.h5 holds."""
    with Embeddings(path) as emb:
        return len(emb)
