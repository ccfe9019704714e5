"""Nearest neighbours between two embeddings.h5 files (or a file and itself), by their mean
embeddings at one layer: the reference read in blocks of rows, so that its size does not set the
memory; the neighbours' annotations carried over (esmshard.search). The files are open
`Embeddings` (esmshard.outputs.reader, whose `nearest` calls this module).
"""

import logging
import warnings
from pathlib import Path
from typing import Callable, NamedTuple

import numpy as np

from ..files import write_parquet, write_tsv
from ..search import Hits, merged, nearest, reliability_index
from ..search.annotations import annotation_columns
from ..search.approximate import (
    KINDS,
    Blocks,
    IndexAsked,
    IndexUse,
    chosen_kind,
    faiss_missing,
    search_indexed,
)
from ..search.transfer import TIES_SEARCHED
from .nearest_terms import carried_terms, carry_asked, terms_table

log = logging.getLogger(__name__)

REFERENCE_ROWS_AT_ONCE = 1 << 14  # with 4,096 queries at once: 256 MB of fp32 products
INDEX_FOLDER = "neighbours_index"  # beside a reference's file: its faiss indexes


class Neighbour(NamedTuple):
    id: str
    distance: float


def model_of(made: dict) -> str:
    """What must match for two files' embeddings to be comparable, from what made each
    (esmshard.compute.provenance): the weights (by SHA-256; random weights by the model's
    name)."""
    weights = made.get("weights_sha256")
    return made.get("model", "?") if weights in (None, "random") else f"weights {weights}"


def comparable_layer(queries, reference, layer: int | None) -> int:
    """The mean layer both files hold (default: the queries' last); ValueError in one line
    naming both files where the model, the layer or the width differ. A per-protein file from
    outside esmshard (esmshard.outputs.per_protein) names neither model nor layer: its width
    alone is checked."""
    names = f"{queries.name} and {reference.name}"
    known = "model" in reference.made_by  # not in a per-protein file from outside esmshard
    if known and model_of(queries.made_by) != model_of(reference.made_by):
        raise ValueError(
            f"{names} were embedded with other models ({model_of(queries.made_by)}, "
            f"{model_of(reference.made_by)}): embed both with the same model"
        )
    chosen = queries.layer("mean", layer)
    if reference.layers is not None and chosen not in reference.layers.get("mean", []):
        raise ValueError(
            f"{reference.name} holds mean embeddings at layers {reference.layers.get('mean', [])}"
            f", not at {chosen} as {queries.name}: choose a layer both hold"
        )
    widths = [emb.stored(f"mean/{chosen}").shape[1] for emb in (queries, reference)]
    if widths[0] != widths[1]:
        raise ValueError(
            f"{names} hold embeddings {widths[0]} and {widths[1]} wide: embed both with the "
            "same model"
        )
    return chosen


def search(
    queries: np.ndarray,
    reference,
    layer: int,
    k: int,
    metric: str = "euclidean",
    own_rows: np.ndarray | None = None,
    rows: tuple[int, int] | None = None,
    device: str | None = None,
    on_block: Callable[[int], None] = lambda rows_done: None,
    allowed: np.ndarray | None = None,
) -> Hits:
    """The `k` nearest reference rows (of `rows`, a range: default all) to each query vector,
    the reference read block by block; `device`: where the products run (esmshard.search);
    `on_block`: called with the rows searched so far after each block; `allowed`: which of
    the reference's rows may be found (None: all)."""
    values = reference.stored(f"mean/{layer}")
    first, end = rows or (0, len(values))
    found = None
    for start in range(first, end, REFERENCE_ROWS_AT_ONCE):
        stop = min(start + REFERENCE_ROWS_AT_ONCE, end)
        block = np.asarray(values[start:stop], dtype=np.float32)
        here = None if allowed is None else allowed[start:stop]
        bound = None if found is None else found.distances[:, k - 1]  # the k-th so far
        hits = nearest(queries, block, k, metric, start, own_rows, device, here, bound)
        found = hits if found is None else merged([found, hits], k)
        on_block(stop - first)
    return found if found is not None else nearest(queries, values[:0], k, metric)


class Searched(NamedTuple):
    """A search's hits, and the index that found them (None: the exact search)."""

    hits: Hits
    index: IndexUse | None


def searched_by(index: IndexAsked | None, queries, reference, layer: int, k: int, metric: str,
                own_rows=None, rows=None, device=None, on_block=lambda rows_done: None,
                allowed=None) -> Searched:  # fmt: skip
    """`search`, or with `index` (its kind `auto` decided here: esmshard.search.approximate)
    the same question asked of a faiss index of the rows; `on_block` then follows the
    queries, as the share of the rows they stand for."""
    blocks = reference_blocks(reference, layer, rows, allowed)
    kind = "exact"
    if index is not None and blocks.rows and len(queries):
        kind = chosen_kind(index.kind, device, blocks.rows, len(queries))
    if kind == "exact":
        hits = search(
            queries, reference, layer, k, metric, own_rows, rows, device, on_block, allowed
        )
        return Searched(hits, None)
    span = (rows[1] - rows[0]) if rows else len(reference.stored(f"mean/{layer}"))
    share = lambda done: on_block(span * done // max(len(queries), 1))  # noqa: E731
    hits, used = search_indexed(queries, blocks, k, metric, own_rows, index._replace(kind=kind),
                                share)  # fmt: skip
    log.info("searched by %s", used.line())
    return Searched(hits, used)


def index_asked(kind: str, reference, rows, subset: str = "", folders=()) -> IndexAsked | None:
    """Which index a search of the reference's `rows` (a range) and `subset` (an aspect, or ""
    for all) uses, kept in `folders` (default: INDEX_FOLDER beside the reference's file);
    None for the exact search."""
    if kind == "exact":
        return None
    path = getattr(reference, "path", None)
    if path is None and not folders:
        raise ValueError(f"an index is kept beside an embeddings.h5 file, and {reference.name} "
                         "are not in one: search them with index='exact'")  # fmt: skip
    folders = folders or (Path(path).parent / INDEX_FOLDER,)
    name = f"{Path(path or 'embeddings').stem}.{rows[0]}-{rows[1]}{'.' + subset if subset else ''}"
    return IndexAsked(kind, tuple(folders), name)


def index_problem(kind: str) -> None:
    """ValueError in one line where `kind` is no index, or a faiss one without faiss."""
    if kind not in KINDS:
        raise ValueError(f"index {kind!r} is not one of {', '.join(KINDS)}")
    if missing := faiss_missing(kind):
        raise ValueError(f"the {kind} index {missing} (or search with index='exact')")


def reference_blocks(reference, layer: int, rows=None, allowed=None) -> Blocks:
    """The reference's rows of `rows` (a range: default all) that `allowed` lets be found, read
    in blocks of REFERENCE_ROWS_AT_ONCE."""
    values = reference.stored(f"mean/{layer}")
    first, end = rows or (0, len(values))
    count = end - first if allowed is None else int(np.count_nonzero(allowed[first:end]))

    def read():
        for start in range(first, end, REFERENCE_ROWS_AT_ONCE):
            stop = min(start + REFERENCE_ROWS_AT_ONCE, end)
            block, numbers = np.asarray(values[start:stop], np.float32), np.arange(start, stop)
            if allowed is not None:
                block, numbers = block[allowed[start:stop]], numbers[allowed[start:stop]]
            yield numbers, block

    return Blocks(count, values.shape[1], read)


def nearest_to(emb, query, k: int, metric: str, layer: int | None, index: str = "exact",
               **carry):  # fmt: skip
    """`Embeddings.nearest`: the proteins of `emb` nearest to one of its IDs (left out of its own
    answer) or to a vector of its width, as Neighbours; to each row of a matrix or each protein
    of another open embeddings.h5, as a table, with the neighbours' annotation columns where
    `carry` names annotations; with `carry`'s terms, the terms carried instead
    (esmshard.outputs.nearest_terms: annotations, terms, max_distance, ontology). `index`:
    exact, or a faiss index kept beside `emb`'s file (esmshard.search.approximate)."""
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"k must be a whole number of 1 or more, not {k!r}")
    index_problem(index)
    asked = carry_asked(**carry, k=int(k))
    if asked.unknown:
        warnings.warn(asked.unknown, stacklevel=3)
    queries = queries_of(emb, query, layer)
    searched = k + (TIES_SEARCHED if asked.transfer else 0)
    ids, every = emb.ids(), (0, len(emb))

    def found(subset="", allowed=None):
        return searched_by(
            index_asked(index, emb, every, subset),
            queries.vectors,
            emb,
            queries.layer,
            searched,
            metric,
            queries.own,
            allowed=allowed,
        ).hits

    hits = found()
    if asked.transfer:
        aspects = {aspect: found(aspect, allowed)
                   for aspect, allowed in asked.aspect_rows(ids).items()}  # fmt: skip
        return terms_table(carried_terms(asked, hits, aspects, queries.ids, ids, metric))
    hits = Hits(hits.rows[:, :k], hits.distances[:, :k])
    if queries.column is None:
        return [
            Neighbour(ids[r], float(d)) for r, d in zip(hits.rows[0], hits.distances[0]) if r >= 0
        ]
    table = hits_table(hits, queries.ids, ids, queries.column)
    for column in annotation_columns(asked.annotations):
        table[column] = [asked.annotations.get(n, {}).get(column, "") for n in table["neighbour"]]
    return table


class Queries(NamedTuple):
    """What `nearest` searches for: the vectors, each one's own row in the reference (or None),
    their IDs, the layer compared, and the table's column of the queries (None: one query,
    answered as Neighbours)."""

    vectors: np.ndarray
    own: np.ndarray | None
    ids: list
    layer: int
    column: str | None


def queries_of(emb, query, layer: int | None) -> Queries:
    """`query` as `nearest` takes it: another open embeddings.h5 (the same file: each protein's
    own row left out), one of `emb`'s IDs, a vector of its width or a matrix of such rows."""
    if hasattr(query, "ids"):
        chosen = comparable_layer(query, emb, layer)
        vectors = np.asarray(query.array("mean", chosen), dtype=np.float32)
        itself = query.path is not None and query.path == emb.path
        return Queries(vectors, np.arange(len(query)) if itself else None, query.ids(), chosen,
                       "id")  # fmt: skip
    chosen = emb.layer("mean", layer)
    if isinstance(query, str):
        row = emb.row(query)
        return Queries(emb.values(row, "mean", chosen)[None, :], np.array([row]), [query],
                       chosen, None)  # fmt: skip
    vectors = np.asarray(query, dtype=np.float32)
    if vectors.shape[-1:] != (emb.dim,) or vectors.ndim not in (1, 2):
        raise ValueError(
            f"a vector of {emb.dim} values, or a matrix of rows that wide, is needed, "
            f"not one of shape {vectors.shape}"
        )
    if not np.isfinite(vectors).all():
        raise ValueError("the query holds NaN or infinite values: it has no neighbours")
    if vectors.ndim == 1:
        return Queries(vectors[None, :], None, ["query"], chosen, None)
    return Queries(vectors, None, list(range(len(vectors))), chosen, "query")


def hit_rows(hits: Hits, query_ids, reference_ids) -> list[tuple]:
    """A row per query and neighbour, nearest first: query, rank (from 1), neighbour, distance."""
    return [
        (query, rank + 1, reference_ids[row], float(d))
        for query, q_rows, q_distances in zip(query_ids, hits.rows, hits.distances)
        for rank, (row, d) in enumerate(zip(q_rows, q_distances))
        if row >= 0
    ]


def hits_table(hits: Hits, query_ids, reference_ids, query_column: str):
    """`hits` as a pandas DataFrame, a row per query and neighbour, nearest first."""
    import pandas as pd

    rows = hit_rows(hits, query_ids, reference_ids)
    return pd.DataFrame(rows, columns=[query_column, "rank", "neighbour", "distance"])


def not_numbers_line(vectors: np.ndarray, queries) -> str | None:
    """The line that counts the queries whose embeddings hold NaN or infinite values (they get
    no neighbours), or None where every one is a number."""
    bad = np.flatnonzero(~np.isfinite(vectors).all(axis=1))
    if not len(bad):
        return None
    return (
        f"{len(bad):,} of the {len(vectors):,} queries' embeddings in {queries.name} hold NaN "
        f"or infinite values (e.g. {queries.ids(int(bad[0]), int(bad[0]) + 1)[0]}): they get "
        "no neighbours; embed them again with precision: fp32"
    )


def transferred(hits: Hits, ids: list[str], annotations: dict, metric: str) -> list[dict]:
    """Per query: its nearest annotated neighbour, the distance, its reliability index and its
    annotation (empty where none of its neighbours is annotated)."""
    columns = annotation_columns(annotations)
    found = []
    for rows, distances in zip(hits.rows, hits.distances):
        named = [(ids[r], d) for r, d in zip(rows, distances) if r >= 0 and ids[r] in annotations]
        if named:
            neighbour, d = named[0]
            ri = float(reliability_index([d], metric)[0])
            found.append({"neighbour": neighbour, "distance": f"{d:.7g}",
                          "reliability_index": round(ri, 6), **annotations[neighbour]})  # fmt: skip
        else:
            found.append({"neighbour": "", "distance": "", "reliability_index": "",
                          **dict.fromkeys(columns, "")})  # fmt: skip
    return found


class Tables(NamedTuple):
    """What a search writes: its neighbours (TSV and Parquet) and, with annotations, the
    per-query transfer; None leaves one out."""

    tsv: str | None
    parquet: str | None = None
    transferred: str | None = None


def write_tables(
    to: Tables, hits: Hits, query_ids, reference_ids, annotations: dict, metric: str, card: dict
) -> None:
    """Write `hits` as the neighbours' table (id, rank, neighbour, distance, the neighbour's
    annotation columns), each file whole or not at all; `card` (model, layer, metric,
    reference) is the Parquet file's metadata."""
    columns = annotation_columns(annotations)
    rows = [
        [*row, *(annotations.get(row[2], {}).get(column, "") for column in columns)]
        for row in hit_rows(hits, query_ids, reference_ids)
    ]
    names = ["id", "rank", "neighbour", "distance", *columns]
    if to.tsv:
        write_tsv(to.tsv, names, [[*r[:3], f"{r[3]:.7g}", *r[4:]] for r in rows])
    if to.parquet:
        types = ["string", "int32", "string", "float32"] + ["string"] * len(columns)
        write_parquet(to.parquet, dict(zip(names, types)), rows, card)
    if to.transferred:
        transfer = transferred(hits, reference_ids, annotations, metric)
        names = ["id", "neighbour", "distance", "reliability_index", *columns]
        write_tsv(to.transferred, names, [[q, *t.values()] for q, t in zip(query_ids, transfer)])
