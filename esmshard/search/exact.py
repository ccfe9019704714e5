"""Exact nearest neighbours of query embeddings in a reference: matrix products in blocks, each
query's candidates re-ranked by distances computed directly in fp32, and the top k of several
reference shards merged into one.

Distances: `euclidean` (as goPredSim and EAT) and `cosine` (1 - cosine similarity). Ties are
broken by the reference row, so that a reference cut into shards gives the same table.
"""

from typing import NamedTuple

import numpy as np

METRICS = ("euclidean", "cosine")
QUERIES_AT_ONCE = 4096  # a block's products: queries x reference rows of fp32
EXTRA_CANDIDATES = 16  # re-ranked beyond k: the products' rounding may reorder near ties
# How far a candidate's distance by the products may be off, as a share of |q|² + |r|² (squared
# euclidean) or absolutely (cosine): fp32 products of 1,280 values err by about 1e-6 of it.
PRODUCTS_ERROR = 1e-4


class Hits(NamedTuple):
    """Each query's nearest reference rows, nearest first (-1 and inf past the reference's end)."""

    rows: np.ndarray  # (queries, k) int64
    distances: np.ndarray  # (queries, k) float32


def exact_distances(queries: np.ndarray, candidates: np.ndarray, metric: str) -> np.ndarray:
    """The distance of each query (n, d) to each of its candidates (n, c, d), computed directly."""
    q = queries[:, None, :].astype(np.float32)
    c = candidates.astype(np.float32)
    if metric == "euclidean":
        return np.sqrt(np.square(c - q).sum(axis=-1, dtype=np.float32))
    norms = np.linalg.norm(q, axis=-1) * np.linalg.norm(c, axis=-1)
    cosine = (q * c).sum(axis=-1, dtype=np.float32) / np.maximum(norms, np.float32(1e-30))
    # rounding can take a vector's cosine with itself past 1: a distance is never below 0
    return np.clip(1 - cosine, 0, 2).astype(np.float32)


def approximate(queries: np.ndarray, reference: np.ndarray, metric: str) -> np.ndarray:
    """A score per pair that orders each query's reference rows as its distances do, from one
    matrix product: squared euclidean distance, or minus the cosine similarity."""
    products = queries @ reference.T
    if metric == "euclidean":
        return np.square(reference).sum(axis=1) - 2 * products  # + |q|², the same along a row
    norms = np.linalg.norm(reference, axis=1) * np.linalg.norm(queries, axis=1)[:, None]
    return -products / np.maximum(norms, 1e-30)


class Candidates(NamedTuple):
    """Each query's best reference rows by the products, and their scores (`approximate`)."""

    rows: np.ndarray
    scores: np.ndarray


def candidates_here(block, reference, wanted: int, metric: str, own, barred) -> Candidates:
    """Each query's `wanted` best reference rows by one matrix product, with numpy; `own`: each
    query's row to leave out (or -1); `barred`: the rows no query may have (None: none)."""
    scores = approximate(block, reference, metric)
    inside = np.flatnonzero(own >= 0)
    scores[inside, own[inside]] = np.inf
    if barred is not None:
        scores[:, barred] = np.inf
    rows = np.argpartition(scores, wanted - 1, axis=1)[:, :wanted]
    return Candidates(rows, np.take_along_axis(scores, rows, axis=1))


def tensor_of(array: np.ndarray, device: str):
    """`array` as a torch tensor on `device` (a read-only one, as a memory-mapped file's, copied
    first: torch takes only writable arrays)."""
    import torch

    return torch.from_numpy(np.require(array, requirements=["W", "C"])).to(device)


def candidates_on(device: str, block, r, wanted: int, metric: str, own, barred) -> Candidates:
    """`candidates_here` with torch on `device` (a GPU): its products and top k there, against
    the reference `r` already there (`tensor_of`)."""
    import torch

    q = tensor_of(block, device)
    if metric == "euclidean":  # |r|² - 2 q·r in one product, no other matrix of that size
        scores = torch.addmm((r * r).sum(dim=1)[None, :], q, r.T, alpha=-2)
    else:
        norms = torch.linalg.vector_norm(q, dim=1)[:, None] * torch.linalg.vector_norm(r, dim=1)
        scores = (q @ r.T).div_(norms.clamp_min_(1e-30)).neg_()
    inside = torch.from_numpy(np.flatnonzero(own >= 0)).to(device)
    scores[inside, torch.from_numpy(own[own >= 0]).to(device)] = float("inf")
    if barred is not None:
        scores[:, torch.from_numpy(barred).to(device)] = float("inf")
    found = torch.topk(scores, wanted, dim=1, largest=False)
    return Candidates(found.indices.cpu().numpy(), found.values.cpu().numpy())


def worth_ranking(block, found: Candidates, metric: str, bound, r2: float) -> np.ndarray:
    """Which candidates may be nearer than `bound` (each query's, a distance; None: any), their
    scores' error allowed for (`r2`: the reference rows' largest |r|²): only those are
    re-ranked."""
    if bound is None:
        return np.ones(found.rows.shape, dtype=bool)
    bound = np.asarray(bound, dtype=np.float64)[:, None]
    if metric == "cosine":
        return 1 + found.scores <= bound + PRODUCTS_ERROR
    q2 = np.einsum("ij,ij->i", block, block)[:, None]
    return found.scores + q2 <= np.square(bound) + PRODUCTS_ERROR * (q2 + r2)


def exact_on(device: str, queries, r, rows: np.ndarray, metric: str) -> np.ndarray:
    """`exact_distances` with torch on `device`, each query's candidates `rows` gathered from
    the reference `r` already there, in place: one copy of them, not three."""
    import torch

    q = tensor_of(queries, device)[:, None, :]
    c = r[torch.from_numpy(rows).to(device)]
    if metric == "euclidean":
        return torch.linalg.vector_norm(c.sub_(q), dim=-1).cpu().numpy()
    norms = torch.linalg.vector_norm(q, dim=-1) * torch.linalg.vector_norm(c, dim=-1)
    cosine = (c.mul_(q)).sum(dim=-1).div_(norms.clamp_min_(1e-30))
    return cosine.neg_().add_(1).clamp_(0, 2).cpu().numpy()


def nearest(
    queries: np.ndarray,
    reference: np.ndarray,
    k: int,
    metric: str = "euclidean",
    first_row: int = 0,
    own_rows: np.ndarray | None = None,
    device: str | None = None,
    allowed: np.ndarray | None = None,
    bound: np.ndarray | None = None,
) -> Hits:
    """The `k` nearest rows of `reference` (rows `first_row`... of the whole reference) to each
    query; `own_rows`: each query's own row in the whole reference, left out (a search of the
    input against itself; -1 for none). `device`: a torch device for the products and the
    re-ranking (None: numpy on the CPU). `allowed`: which rows of `reference` may be found
    (None: all). `bound`: each query's distance beyond which a row is of no use (the k-th of
    what other blocks found): candidates surely past it are not re-ranked, and none of them is
    found."""
    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r}: use one of {', '.join(METRICS)}")
    n = len(queries)
    reference = np.asarray(reference, dtype=np.float32)
    rows = np.full((n, k), -1, dtype=np.int64)
    distances = np.full((n, k), np.inf, dtype=np.float32)
    wanted = min(k + EXTRA_CANDIDATES + 1, len(reference))
    if wanted == 0:
        return Hits(rows, distances)
    barred = None if allowed is None else np.flatnonzero(~np.asarray(allowed, dtype=bool))
    on_device = reference
    if device is not None:
        on_device = tensor_of(reference, device)  # once for every block of queries
    pruned = bound is not None and metric == "euclidean"
    r2 = float(np.einsum("ij,ij->i", reference, reference).max()) if pruned else 0.0
    for start in range(0, n, QUERIES_AT_ONCE):
        block = np.asarray(queries[start : start + QUERIES_AT_ONCE], dtype=np.float32)
        own = np.full(len(block), -1, dtype=np.int64)
        if own_rows is not None:
            own = own_rows[start : start + len(block)] - first_row
            own[(own < 0) | (own >= len(reference))] = -1
        if device is None:
            found = candidates_here(block, reference, wanted, metric, own, barred)
        else:
            found = candidates_on(device, block, on_device, wanted, metric, own, barred)
        here = None if bound is None else bound[start : start + len(block)]
        worth = worth_ranking(block, found, metric, here, r2)
        exact = re_ranked(block, reference, on_device, found.rows, worth, metric, device)
        candidates = found.rows
        exact[candidates == own[:, None]] = np.inf
        if barred is not None:
            exact[~allowed[candidates]] = np.inf
        hits = top_k(candidates + first_row, exact, k)
        rows[start : start + len(block)] = hits.rows
        distances[start : start + len(block)] = hits.distances
    return Hits(rows, distances)


def re_ranked(block, reference, on_device, candidates, worth, metric: str, device) -> np.ndarray:
    """The exact distance of each query to each of its candidates that `worth` marks (inf for
    the others): all at once where most are, else pair by pair."""

    def exactly(queries, rows):
        if device is None:
            return exact_distances(queries, reference[rows], metric)
        return exact_on(device, queries, on_device, rows, metric)

    if worth.mean() > 0.5:
        exact = exactly(block, candidates)
        exact[~worth] = np.inf
        return exact
    exact = np.full(candidates.shape, np.inf, dtype=np.float32)
    pair, rank = np.nonzero(worth)
    exact[pair, rank] = exactly(block[pair], candidates[pair, rank][:, None])[:, 0]
    return exact


def top_k(rows: np.ndarray, distances: np.ndarray, k: int) -> Hits:
    """Each query's `k` smallest distances among its (rows, distances), ties by row; padded with
    -1 and inf where it has fewer."""
    order = np.lexsort((rows, distances), axis=1)[:, :k]
    kept_rows = np.take_along_axis(rows, order, axis=1)
    kept = np.take_along_axis(distances, order, axis=1)
    kept_rows[~np.isfinite(kept)] = -1
    if kept.shape[1] < k:
        pad = k - kept.shape[1]
        kept_rows = np.pad(kept_rows, ((0, 0), (0, pad)), constant_values=-1)
        kept = np.pad(kept, ((0, 0), (0, pad)), constant_values=np.inf)
    return Hits(kept_rows, kept.astype(np.float32))


def merged(shards: list[Hits], k: int) -> Hits:
    """The top `k` of several reference shards' hits for the same queries."""
    rows = np.concatenate([h.rows for h in shards], axis=1)
    distances = np.concatenate([h.distances for h in shards], axis=1)
    return top_k(rows, distances, k)
