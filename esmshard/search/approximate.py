"""Approximate nearest neighbours with a faiss index (`ivf`: inverted lists of flat vectors;
`hnsw`: a navigable small-world graph), built once per reference's rows and kept in a folder
beside it under its content's address: the next search of the same vectors reads it, a search
of other vectors (or another metric) builds its own and replaces it.

Each search tunes how much of the index it visits (IVF's lists probed, HNSW's candidate list)
on a sample of its own queries, until their recall@k against the exact search (esmshard.search
.exact) reaches `RECALL_GOAL`, and reports that recall. IVF's lists are searched by the exact
search, so its distances are that search's; HNSW's come from faiss' direct fp32 sums:
euclidean, or 1 - cosine on unit vectors (half their squared distance).
"""

import glob
import hashlib
import json
import logging
import math
import re
import time
from pathlib import Path
from typing import Callable, Iterable, NamedTuple

import numpy as np

from ..files import atomic_path, write_json
from .exact import Hits, merged, nearest, top_k

log = logging.getLogger(__name__)

KINDS = ("exact", "ivf", "hnsw", "auto")
APPROXIMATE = ("ivf", "hnsw")
RECALL_GOAL = 0.95
SAMPLED_QUERIES = 200  # the queries whose recall@k is measured against the exact search
QUERIES_AT_ONCE = 4096
TRAINING_PER_LIST = 40  # IVF: training rows per list (faiss asks 39 or more)
HNSW_LINKS = 32
# `auto` on a CPU: an index from this many rows and queries, where its first search (the index
# built) already takes less time than the exact one (benchmarks/approximate_index.py)
AUTO_ROWS = 100_000
AUTO_QUERIES = 2_000
FORMAT = 1  # of the index files: a new one is built where it differs


class IndexAsked(NamedTuple):
    """Which index a search uses (one of KINDS), where its files may already be (`folders`,
    the first the one written to), and the name its rows go by there (the reference's file,
    rows and subset)."""

    kind: str
    folders: tuple
    name: str


class IndexUse(NamedTuple):
    """What a search's index was: its kind and file, built now or read, the seconds its build
    took, its search setting (lists probed, or HNSW's candidates), and the recall@k of a
    sample of the queries."""

    kind: str
    path: str
    built: bool
    build_seconds: float
    setting: int
    recall: float
    sample: int

    def line(self) -> str:
        """How the index was used, for a log."""
        how = f"built in {self.build_seconds:.1f} s" if self.built else "read"
        return (f"the {self.kind} index {self.path} ({how}): recall@k {self.recall:.3f} on "
                f"{self.sample} queries, setting {self.setting}")  # fmt: skip


class Blocks(NamedTuple):
    """The rows an index holds, read block by block: `read()` yields (row numbers, vectors)."""

    rows: int
    width: int
    read: Callable[[], Iterable[tuple[np.ndarray, np.ndarray]]]


def faiss_present() -> bool:
    try:
        import faiss  # noqa: F401
    except ImportError:
        return False
    return True


def faiss_missing(kind: str) -> str | None:
    """Why an index of `kind` cannot be built here, said after its name (faiss not
    installed), or None."""
    if kind in APPROXIMATE and not faiss_present():
        return "is a faiss index, and faiss is not installed: pip install faiss-cpu"
    return None


def chosen_kind(kind: str, device: str | None, rows: int, queries: int) -> str:
    """The index `auto` means: IVF on a CPU from AUTO_ROWS rows and AUTO_QUERIES queries
    where faiss is installed; else exact."""
    if kind != "auto":
        return kind
    on_cpu = device is None or device == "cpu"
    large = rows >= AUTO_ROWS and queries >= AUTO_QUERIES
    return "ivf" if on_cpu and large and faiss_present() else "exact"


def unit(vectors: np.ndarray, metric: str) -> np.ndarray:
    """The vectors faiss compares: as they are (euclidean), or scaled to length 1 (cosine)."""
    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    if metric == "euclidean":
        return vectors
    return vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-30)


def distances_of(squared: np.ndarray, metric: str) -> np.ndarray:
    """faiss' squared L2 distances as the search's: euclidean, or 1 - cosine."""
    squared = np.maximum(squared, 0)
    if metric == "euclidean":
        return np.sqrt(squared).astype(np.float32)
    return np.clip(squared / 2, 0, 2).astype(np.float32)


class Scan(NamedTuple):
    """One pass over the rows: their content's address, IVF's training rows, and the exact
    top k of the sampled queries."""

    digest: str
    training: np.ndarray
    exact: Hits


def scan(blocks: Blocks, sample: np.ndarray, k: int, metric: str, own, kind: str) -> Scan:
    """Read every block once: hash rows and vectors, keep every n-th row for training, and
    search the sampled queries exactly (their `own` rows left out)."""
    # rows and vectors hashed apart: the same rows read in other blocks have the same address
    numbers, values = hashlib.sha256(), hashlib.sha256()
    every = max(1, blocks.rows // (TRAINING_PER_LIST * lists_for(blocks.rows)))
    training, exact, seen = [np.zeros((0, blocks.width), np.float32)], None, 0
    for rows, vectors in blocks.read():
        numbers.update(memoryview(np.ascontiguousarray(rows, dtype=np.int64)).cast("B"))
        values.update(memoryview(np.ascontiguousarray(vectors, dtype=np.float32)).cast("B"))
        if kind == "ivf":  # HNSW needs no training
            training.append(vectors[(seen + np.arange(len(rows))) % every == 0])
        seen += len(rows)
        found = exact_of(sample, vectors, rows, k, metric, own)
        exact = found if exact is None else merged([exact, found], k)
    digest = hashlib.blake2b(f"{FORMAT} {kind} {metric}".encode(), digest_size=16)
    digest.update(numbers.digest() + values.digest())
    return Scan(digest.hexdigest(), np.concatenate(training), exact)


def exact_of(sample, vectors, rows, k: int, metric: str, own) -> Hits:
    """The exact top k of the sampled queries among one block's rows (numbered `rows`,
    ascending), their `own` rows left out."""
    local = np.full(len(sample), -1, dtype=np.int64)
    if own is not None and len(rows):
        at = np.minimum(np.searchsorted(rows, own), len(rows) - 1)
        local = np.where(rows[at] == own, at, -1)
    hits = nearest(sample, vectors, k, metric, own_rows=local, device="cpu")
    return Hits(np.where(hits.rows >= 0, rows[np.maximum(hits.rows, 0)], -1), hits.distances)


def lists_for(rows: int) -> int:
    """IVF's lists: about the square root of the rows, each trained on TRAINING_PER_LIST."""
    return max(1, min(round(math.sqrt(rows)), rows // TRAINING_PER_LIST))


def built(blocks: Blocks, training: np.ndarray, kind: str, metric: str):
    """A new faiss index of every block's vectors, numbered by their rows."""
    import faiss

    spec = f"IVF{lists_for(blocks.rows)},Flat" if kind == "ivf" else f"IDMap,HNSW{HNSW_LINKS}"
    index = faiss.index_factory(blocks.width, spec, faiss.METRIC_L2)
    if kind == "ivf":
        index.train(unit(training, metric))
    for rows, vectors in blocks.read():
        index.add_with_ids(unit(vectors, metric), np.asarray(rows, dtype=np.int64))
    return index


def searched(index, queries: np.ndarray, k: int, metric: str, own, kind: str, setting: int):
    """The `k` nearest rows of each query in `index`, visiting `setting` of it; `own`: each
    query's row to leave out (None: none)."""
    import faiss

    found = k + (own is not None)
    if kind == "ivf":
        rows, distances = by_lists(faiss.extract_index_ivf(index), queries, found, metric, setting)
    else:
        faiss.downcast_index(index.index).hnsw.efSearch = setting
        squared, rows = index.search(unit(queries, metric), found)
        distances = np.where(rows >= 0, distances_of(squared, metric), np.inf).astype(np.float32)
    if own is not None:
        distances[rows == own[:, None]] = np.inf
    return top_k(rows, distances, k)


def by_lists(ivf, queries: np.ndarray, k: int, metric: str, probes: int):
    """Each query's `k` nearest rows in the `probes` inverted lists of `ivf` nearest to it, and
    their distances: list by list, the queries that probe it searched exactly in it at once
    (esmshard.search.exact), so that a list is read once for them all, not once a query."""
    import faiss

    vectors = unit(queries, metric)
    _, lists = ivf.quantizer.search(vectors, probes)
    rows = np.full((len(queries), probes, k), -1, dtype=np.int64)
    distances = np.full((len(queries), probes, k), np.inf, dtype=np.float32)
    pairs = np.argsort(lists, axis=None, kind="stable")
    starts = np.searchsorted(lists.ravel()[pairs], np.arange(ivf.nlist + 1))
    for number in np.flatnonzero(np.diff(starts)):
        size = ivf.invlists.list_size(int(number))
        if size == 0:
            continue
        codes = faiss.rev_swig_ptr(ivf.invlists.get_codes(int(number)), size * ivf.d * 4)
        held = np.frombuffer(codes, dtype=np.float32).reshape(size, ivf.d)
        ids = faiss.rev_swig_ptr(ivf.invlists.get_ids(int(number)), size).view(np.int64)
        query, probe = np.divmod(pairs[starts[number] : starts[number + 1]], probes)
        hits = nearest(vectors[query], held, min(k, size), metric, device="cpu")
        rows[query, probe, : hits.rows.shape[1]] = ids[hits.rows]
        distances[query, probe, : hits.rows.shape[1]] = hits.distances
    return rows.reshape(len(queries), -1), distances.reshape(len(queries), -1)


def recall(found: Hits, exact: Hits) -> float:
    """The share of the exact search's rows that `found` holds, over the queries."""
    wanted = exact.rows >= 0
    held = [np.isin(e[w], f).sum() for e, f, w in zip(exact.rows, found.rows, wanted)]
    return float(np.sum(held) / max(wanted.sum(), 1))


def tuned(index, sample, exact: Hits, k: int, metric: str, own, kind: str, first=None):
    """The first setting, doubled from `first` (None: the smallest), at which the sample's
    recall@k reaches RECALL_GOAL, or the largest, and that recall."""
    import faiss

    if kind == "ivf":
        settings = doubling(first or 1, faiss.extract_index_ivf(index).nlist)
    else:
        settings = doubling(first or max(16, k), 1024)
    for setting in settings:
        measured = recall(searched(index, sample, k, metric, own, kind, setting), exact)
        if measured >= RECALL_GOAL:
            break
    return setting, measured


def doubling(first: int, last: int) -> list[int]:
    values = [first]
    while values[-1] < last:
        values.append(min(values[-1] * 2, last))
    return values


def sample_of(queries: int) -> np.ndarray:
    """Up to SAMPLED_QUERIES of the queries, evenly spread."""
    return np.unique(np.linspace(0, queries - 1, min(queries, SAMPLED_QUERIES)).astype(int))


def search_indexed(queries, blocks: Blocks, k: int, metric: str, own, asked: IndexAsked,
                   on_queries: Callable[[int], None] = lambda done: None):  # fmt: skip
    """The `k` nearest rows of `blocks` to each query by an index of `asked.kind` (read where
    one of the same vectors is kept, else built and kept), as Hits and its IndexUse; `own`:
    each query's row to leave out (None: none); `on_queries`: called with the queries searched
    so far."""
    queries = np.asarray(queries, dtype=np.float32)
    own = None if own is None else np.asarray(own, dtype=np.int64)
    picks = sample_of(len(queries))
    mine = None if own is None else own[picks]
    scanned = scan(blocks, queries[picks], k, metric, mine, asked.kind)
    index, use, record = index_of(blocks, scanned, asked, metric)
    # a kept index starts from the setting its build found: most searches need no other
    setting, measured = tuned(index, queries[picks], scanned.exact, k, metric, mine, asked.kind,
                              record.get("setting"))  # fmt: skip
    if use.built:
        use = use._replace(path=str(kept(index, {**record, "setting": setting}, asked)))
    found = []
    for start in range(0, len(queries), QUERIES_AT_ONCE):
        chunk = slice(start, start + QUERIES_AT_ONCE)
        found.append(searched(index, queries[chunk], k, metric, None if own is None else own[chunk],
                              asked.kind, setting))  # fmt: skip
        on_queries(min(start + QUERIES_AT_ONCE, len(queries)))
    hits = Hits(
        np.concatenate([h.rows for h in found]), np.concatenate([h.distances for h in found])
    )
    return hits, use._replace(setting=setting, recall=round(measured, 4), sample=len(picks))


def index_of(blocks: Blocks, scanned: Scan, asked: IndexAsked, metric: str):
    """The index of `blocks` kept under its content's address (its file mapped, not read), or
    one built now (to be kept once tuned), its IndexUse and its record."""
    import faiss

    path = kept_index(asked, scanned.digest, metric)
    if path is not None:
        record = json.loads(path.with_suffix(".json").read_text())
        use = IndexUse(asked.kind, str(path), False, record["build_seconds"], 0, 0.0, 0)
        return faiss.read_index(str(path), faiss.IO_FLAG_MMAP), use, record
    started = time.perf_counter()
    index = built(blocks, scanned.training, asked.kind, metric)
    seconds = round(time.perf_counter() - started, 1)
    record = {"digest": scanned.digest, "kind": asked.kind, "metric": metric, "rows": blocks.rows,
              "build_seconds": seconds, "faiss": faiss.__version__}  # fmt: skip
    return index, IndexUse(asked.kind, "", True, seconds, 0, 0.0, 0), record


def file_name(asked: IndexAsked, digest: str) -> str:
    return f"{asked.name}.{asked.kind}.{digest}.faiss"


def kept_records(folder: Path, asked: IndexAsked):
    """The records of the indexes esmshard kept in `folder` under `asked`'s name and kind:
    (path, record) for each file named by a digest its own record holds, and none other."""
    named = re.compile(rf"{re.escape(asked.name)}\.{asked.kind}\.([0-9a-f]{{32}})\.json")
    for path in folder.glob(f"{glob.escape(asked.name)}.{asked.kind}.*.json"):
        digest = named.fullmatch(path.name)
        try:
            record = json.loads(path.read_text()) if digest else None
        except (OSError, ValueError):
            continue
        if isinstance(record, dict) and record.get("digest") == digest[1]:
            yield path, record


def kept_index(asked: IndexAsked, digest: str, metric: str) -> Path | None:
    """The kept index of these vectors, in one of `asked.folders`; an index kept for other
    vectors or another metric under the same name is said to be rebuilt."""
    for folder in map(Path, asked.folders):
        if (folder / file_name(asked, digest)).with_suffix(".json").is_file():
            return folder / file_name(asked, digest)
    for folder in map(Path, asked.folders):
        for other, record in kept_records(folder, asked):
            why = (f"the {record['metric']} metric, not {metric}" if record["metric"] != metric
                   else "other vectors (the reference changed)")  # fmt: skip
            log.warning("%s was built for %s: building a new %s index", other.with_suffix(".faiss"),
                        why, asked.kind)  # fmt: skip
    return None


def kept(index, record: dict, asked: IndexAsked) -> Path:
    """Write the index and its record (last: an index is kept once its record exists) to the
    first folder of `asked` that can be written, removing those it replaces (esmshard's of the
    same name and kind, for other vectors); its path."""
    import faiss

    for folder in map(Path, asked.folders):
        try:
            folder.mkdir(parents=True, exist_ok=True)
            path = folder / file_name(asked, record["digest"])
            with atomic_path(path) as tmp:
                faiss.write_index(index, str(tmp))
        except OSError as error:
            log.info("cannot keep the index in %s (%s): trying the next folder", folder, error)
            continue
        write_json(path.with_suffix(".json"), record)
        for other, _ in kept_records(folder, asked):
            if other != path.with_suffix(".json"):
                other.unlink(missing_ok=True)
                other.with_suffix(".faiss").unlink(missing_ok=True)
                log.info("removed %s, replaced by %s", other.with_suffix(".faiss"), path.name)
        return path
    raise OSError(f"no folder of {', '.join(map(str, asked.folders))} can keep the index")
