"""Exact nearest neighbours against numpy's whole distance matrix, and shards merged."""

import numpy as np
import pytest

from esmshard.search import Hits, merged, nearest


def brute_force(queries, reference, k, metric, own=None) -> Hits:
    """Every distance in float64, sorted by distance then row."""
    q, r = queries.astype(np.float64), reference.astype(np.float64)
    if metric == "euclidean":
        d = np.sqrt(((q[:, None, :] - r[None, :, :]) ** 2).sum(-1))
    else:
        d = 1 - (q @ r.T) / np.outer(np.linalg.norm(q, axis=1), np.linalg.norm(r, axis=1))
    if own is not None:
        d[np.arange(len(q)), own] = np.inf
    order = np.lexsort((np.broadcast_to(np.arange(len(r)), d.shape), d), axis=1)[:, :k]
    return Hits(order, np.take_along_axis(d, order, axis=1))


@pytest.fixture
def embeddings():
    rng = np.random.default_rng(7)
    centres = rng.normal(size=(20, 64)).astype(np.float32)
    reference = centres[rng.integers(0, 20, 500)] + 0.3 * rng.normal(size=(500, 64))
    queries = centres[rng.integers(0, 20, 40)] + 0.3 * rng.normal(size=(40, 64))
    return queries.astype(np.float32), reference.astype(np.float32)


@pytest.mark.parametrize("metric", ["euclidean", "cosine"])
def test_the_k_nearest_equal_a_whole_distance_matrix(embeddings, metric):
    queries, reference = embeddings
    found = nearest(queries, reference, 10, metric)
    expected = brute_force(queries, reference, 10, metric)
    np.testing.assert_array_equal(found.rows, expected.rows)
    np.testing.assert_allclose(found.distances, expected.distances, rtol=1e-5)


@pytest.mark.parametrize("metric", ["euclidean", "cosine"])
def test_a_reference_in_three_shards_gives_the_same_table(embeddings, metric):
    queries, reference = embeddings
    whole = nearest(queries, reference, 10, metric)
    cuts = [0, 120, 377, 500]
    shards = [
        nearest(queries, reference[a:b], 10, metric, first_row=a) for a, b in zip(cuts, cuts[1:])
    ]
    together = merged(shards, 10)
    np.testing.assert_array_equal(together.rows, whole.rows)
    np.testing.assert_array_equal(together.distances, whole.distances)


def test_a_search_of_the_input_against_itself_leaves_each_own_row_out(embeddings):
    _, reference = embeddings
    own = np.arange(len(reference))
    found = nearest(reference, reference, 5, "euclidean", own_rows=own)
    assert not (found.rows == own[:, None]).any()
    expected = brute_force(reference, reference, 5, "euclidean", own=own)
    np.testing.assert_array_equal(found.rows, expected.rows)
    halves = [nearest(reference, reference[a:b], 5, "euclidean", first_row=a, own_rows=own)
              for a, b in ((0, 250), (250, 500))]  # fmt: skip
    np.testing.assert_array_equal(merged(halves, 5).rows, found.rows)


def test_k_past_the_references_size_pads_with_no_neighbour(embeddings):
    queries, reference = embeddings
    found = nearest(queries, reference[:3], 5, "euclidean")
    assert (found.rows[:, 3:] == -1).all() and np.isinf(found.distances[:, 3:]).all()
    assert sorted(found.rows[0, :3]) == [0, 1, 2]


def test_an_unknown_metric_is_refused(embeddings):
    queries, reference = embeddings
    with pytest.raises(
        ValueError, match="unknown metric 'manhattan': use one of euclidean, cosine"
    ):
        nearest(queries, reference, 3, "manhattan")


@pytest.mark.parametrize("metric", ["euclidean", "cosine"])
def test_products_in_torch_give_the_same_hits(embeddings, metric):
    """The device path (torch's products, top k and re-ranking), here on the CPU: a GPU runs
    the same. The rows are numpy's; the distances differ only in the order of their sums."""
    queries, reference = embeddings
    own = np.arange(len(queries))
    here = nearest(queries, reference, 7, metric, own_rows=own)
    torch_path = nearest(queries, reference, 7, metric, own_rows=own, device="cpu")
    np.testing.assert_array_equal(torch_path.rows, here.rows)
    np.testing.assert_allclose(torch_path.distances, here.distances, rtol=1e-6, atol=1e-6)
