"""faiss indexes (IVF, HNSW) against numpy's whole distance matrix: the recall each search
reports is the recall of its sampled queries, its setting the least that reaches the goal;
an index is kept, read by the next search of the same vectors and rebuilt, said, for other
vectors or another metric."""

import logging

import numpy as np
import pytest
from test_exact import brute_force

from esmshard.search import approximate
from esmshard.search.approximate import (
    AUTO_QUERIES,
    AUTO_ROWS,
    RECALL_GOAL,
    Blocks,
    IndexAsked,
    chosen_kind,
    recall,
    sample_of,
    search_indexed,
    searched,
)

pytest.importorskip("faiss")

KINDS = ("ivf", "hnsw")


def clustered(rows: int, seed: int, width: int = 48) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centres = np.random.default_rng(0).normal(size=(40, width))
    return (centres[rng.integers(0, 40, rows)] + 0.4 * rng.normal(size=(rows, width))).astype(
        np.float32
    )


def blocks_of(reference: np.ndarray, at_once: int = 700) -> Blocks:
    def read():
        for start in range(0, len(reference), at_once):
            stop = min(start + at_once, len(reference))
            yield np.arange(start, stop), reference[start:stop]

    return Blocks(len(reference), reference.shape[1], read)


REFERENCE, QUERIES = clustered(4_000, 1), clustered(600, 2)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("metric", ["euclidean", "cosine"])
def test_the_recall_said_is_the_samples_and_the_distances_are_exact(tmp_path, kind, metric):
    asked = IndexAsked(kind, (tmp_path,), "reference")
    hits, use = search_indexed(QUERIES, blocks_of(REFERENCE), 10, metric, None, asked)
    truth = brute_force(QUERIES, REFERENCE, 10, metric)
    picks = sample_of(len(QUERIES))
    assert use.sample == len(picks) == approximate.SAMPLED_QUERIES
    sampled = recall(hits._replace(rows=hits.rows[picks]), truth._replace(rows=truth.rows[picks]))
    assert use.recall == pytest.approx(sampled, abs=1e-4)
    assert use.recall >= RECALL_GOAL and recall(hits, truth) >= 0.9
    # the setting is the least that reaches the goal: half of it does not
    if use.setting > (1 if kind == "ivf" else 16):
        import faiss

        index = faiss.read_index(use.path)
        half = searched(index, QUERIES[picks], 10, metric, None, kind, use.setting // 2)
        assert recall(half, truth._replace(rows=truth.rows[picks])) < RECALL_GOAL
    # each row found is at its exact distance, nearest first
    found = hits.rows >= 0
    exact = brute_force(QUERIES, REFERENCE, len(REFERENCE), metric)
    by_row = np.empty_like(exact.distances)
    np.put_along_axis(by_row, exact.rows, exact.distances, axis=1)
    np.testing.assert_allclose(hits.distances[found],
                               np.take_along_axis(by_row, np.maximum(hits.rows, 0), 1)[found],
                               rtol=1e-4, atol=1e-5)  # fmt: skip
    assert (np.diff(hits.distances, axis=1) >= 0).all()


def test_an_index_is_kept_read_again_and_rebuilt_for_other_vectors_or_metric(tmp_path, caplog):
    asked = IndexAsked("ivf", (tmp_path,), "reference")
    first, built = search_indexed(QUERIES, blocks_of(REFERENCE), 5, "euclidean", None, asked)
    again, read = search_indexed(QUERIES, blocks_of(REFERENCE, 333), 5, "euclidean", None, asked)
    assert built.built and not read.built and read.path == built.path
    assert read.build_seconds == built.build_seconds
    np.testing.assert_array_equal(first.rows, again.rows)
    assert not caplog.records or "building" not in caplog.text
    changed = REFERENCE.copy()
    changed[17] += 1
    # a user's files beside the indexes, named like them, are neither read as records nor removed
    users = ["reference.ivf.notes.json", f"reference.ivf.{'0' * 32}.json"]
    for name in users:
        (tmp_path / name).write_text('{"metric": "mine"}')
    with caplog.at_level(logging.WARNING):
        _, rebuilt = search_indexed(QUERIES, blocks_of(changed), 5, "euclidean", None, asked)
    assert rebuilt.built and rebuilt.path != built.path
    assert (
        f"{built.path} was built for other vectors (the reference changed): building"
        in caplog.text
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [rebuilt.path.rsplit("/", 1)[1], rebuilt.path.rsplit("/", 1)[1][: -len("faiss")] + "json",
         *users]
    )  # fmt: skip
    assert "mine" not in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        search_indexed(QUERIES, blocks_of(changed), 5, "cosine", None, asked)
    assert f"{rebuilt.path} was built for the euclidean metric, not cosine" in caplog.text


def test_own_rows_are_left_out_and_an_unwritable_folder_is_passed_by(tmp_path):
    blocked = tmp_path / "a file"
    blocked.write_text("")
    asked = IndexAsked("hnsw", (blocked / "index", tmp_path / "run"), "self")
    own = np.arange(0, len(REFERENCE), 5)  # a fifth of the reference searched against it all
    queries = REFERENCE[own]
    hits, use = search_indexed(queries, blocks_of(REFERENCE), 3, "euclidean", own, asked)
    assert use.path.startswith(str(tmp_path / "run"))
    assert not (hits.rows == own[:, None]).any()
    assert use.recall >= RECALL_GOAL  # measured without the own rows too
    assert recall(hits, brute_force(queries, REFERENCE, 3, "euclidean", own)) >= 0.9


def test_auto_is_ivf_on_a_cpu_for_many_rows_and_queries_else_exact():
    many = (AUTO_ROWS, AUTO_QUERIES)
    assert chosen_kind("auto", "cpu", *many) == chosen_kind("auto", None, *many) == "ivf"
    assert chosen_kind("auto", "cuda", 10 * AUTO_ROWS, 10 * AUTO_QUERIES) == "exact"
    assert chosen_kind("auto", "cpu", AUTO_ROWS - 1, AUTO_QUERIES) == "exact"
    assert chosen_kind("auto", "cpu", AUTO_ROWS, AUTO_QUERIES - 1) == "exact"
    assert chosen_kind("hnsw", "cuda", 10, 1) == "hnsw"
