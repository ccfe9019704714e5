"""Nearest neighbours between embeddings.h5 files: streamed by blocks of the reference, checked
for the same model, layer and width, and `Embeddings.nearest`."""

import numpy as np
import pytest
from helpers import MODEL, SLICE

import esmshard
from esmshard.outputs import nearest as neighbours
from esmshard.outputs.reader import Embeddings


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A reference of 60 real proteins and 12 queries (6 of them in the reference too), each
    saved as an outdir, embedded with the same model and store."""
    folder = tmp_path_factory.mktemp("neighbours")
    store = folder / "store"
    reference = dict((h[1:].split()[0], s) for h, s in SLICE[:60])
    queries = dict((h[1:].split()[0], s) for h, s in SLICE[54:66])
    esmshard.embed(reference, MODEL, repr_layers=(-1, 0), store=store).save(folder / "reference")
    esmshard.embed(queries, MODEL, repr_layers=(-1, 0), store=store).save(folder / "queries")
    return folder


def test_streamed_blocks_equal_one_whole_search(saved, monkeypatch):
    with Embeddings(saved / "queries") as q, Embeddings(saved / "reference") as r:
        layer = neighbours.comparable_layer(q, r, None)
        vectors = q.array("mean", layer)
        whole = neighbours.search(vectors, r, layer, 5)
        monkeypatch.setattr(neighbours, "REFERENCE_ROWS_AT_ONCE", 7)
        blocks = neighbours.search(vectors, r, layer, 5)
        # torch's path: later blocks re-rank only the candidates that may beat the k-th so far
        on_torch = neighbours.search(vectors, r, layer, 5, device="cpu")
    np.testing.assert_array_equal(blocks.rows, whole.rows)
    np.testing.assert_array_equal(blocks.distances, whole.distances)
    np.testing.assert_array_equal(on_torch.rows, whole.rows)
    np.testing.assert_allclose(on_torch.distances, whole.distances, rtol=1e-6)


def test_nearest_by_id_leaves_the_protein_out_and_by_vector_finds_it(saved):
    with Embeddings(saved / "reference") as r:
        first = r.ids()[0]
        by_id = r.nearest(first, k=3)
        by_vector = r.nearest(r.values(first, "mean"), k=3, metric="cosine")
        values, ids = r.array("mean"), r.ids()
    assert first not in [n.id for n in by_id] and len(by_id) == 3
    assert by_vector[0].id == first and by_vector[0].distance == pytest.approx(0, abs=1e-6)
    expected = np.sqrt(((values[1:] - values[0]) ** 2).sum(1))
    assert [n.id for n in by_id] == [ids[1 + i] for i in np.argsort(expected)[:3]]


def test_another_layer_is_refused_in_one_line_naming_both(saved):
    with Embeddings(saved / "queries") as q, Embeddings(saved / "reference") as r:
        with pytest.raises(KeyError, match="holds 'mean' at layers"):
            neighbours.comparable_layer(q, r, 3)
        assert neighbours.comparable_layer(q, r, 0) == 0


def test_many_queries_at_once_give_one_table(saved):
    with Embeddings(saved / "queries") as q, Embeddings(saved / "reference") as r:
        table = r.nearest(q, k=3)
        matrix = r.nearest(q.array("mean"), k=3, metric="cosine")
        one_by_one = [r.nearest(q.values(i, "mean"), k=3) for i in q.ids()]
        itself = r.nearest(r, k=2)
        ids = q.ids()
    assert list(table.columns) == ["id", "rank", "neighbour", "distance"] and len(table) == 36
    for n, query in enumerate(ids):
        mine = table[table["id"] == query]
        assert list(mine["neighbour"]) == [hit.id for hit in one_by_one[n]]
        np.testing.assert_allclose(mine["distance"], [hit.distance for hit in one_by_one[n]])
    assert list(matrix.columns) == ["query", "rank", "neighbour", "distance"]
    assert list(matrix["query"][:3]) == [0, 0, 0]
    assert len(itself) == 120 and not (itself["id"] == itself["neighbour"]).any()


def test_a_vector_is_its_own_nearest_at_cosine_distance_zero_never_below(saved):
    with Embeddings(saved / "reference") as r:
        found = [r.nearest(r.values(i, "mean"), k=1, metric="cosine")[0] for i in r.ids()]
    assert all(hit.distance >= 0 for hit in found)
    assert [hit.distance for hit in found] == pytest.approx([0] * len(found), abs=1e-6)


@pytest.mark.parametrize("k", [-1, 0, 2.5, True])
def test_k_that_is_no_count_is_refused_in_one_line(saved, k):
    with Embeddings(saved / "reference") as r:
        with pytest.raises(ValueError, match=f"k must be a whole number of 1 or more, not {k!r}"):
            r.nearest(r.ids()[0], k=k)


def test_a_query_that_is_not_numbers_is_refused_not_answered_empty(saved):
    with Embeddings(saved / "reference") as r:
        vector = r.values(0, "mean").copy()
        vector[3] = np.nan
        with pytest.raises(ValueError, match="the query holds NaN or infinite values"):
            r.nearest(vector)


def test_queries_whose_embeddings_are_not_numbers_are_counted_in_one_line(saved):
    with Embeddings(saved / "queries") as q:
        vectors = q.array("mean").astype(np.float32)
        assert neighbours.not_numbers_line(vectors, q) is None
        vectors[[2, 5], 0] = np.nan
        line = neighbours.not_numbers_line(vectors, q)
        assert line == (
            f"2 of the 12 queries' embeddings in {q.name} hold NaN or infinite values (e.g. "
            f"{q.ids()[2]}): they get no neighbours; embed them again with precision: fp32"
        )


def test_a_table_of_neighbours_carries_their_annotations_and_terms(saved, tmp_path):
    """`nearest(other, annotations=..., terms=...)`: what `esmshard neighbours` carries."""
    with Embeddings(saved / "queries") as q, Embeddings(saved / "reference") as r:
        ec = {i: f"1.1.{n % 2}.1;2.{n}" for n, i in enumerate(r.ids())}
        table_file = tmp_path / "ec.tsv"
        table_file.write_text("id\tec\n" + "".join(f"{i}\t{v}\n" for i, v in ec.items()))
        table = r.nearest(q, k=2, annotations=table_file)
        terms = r.nearest(q, k=1, annotations=table_file, terms="ec")
        with pytest.raises(ValueError, match="has no column 'go'"):
            r.nearest(q, annotations=table_file, terms="go")
        with pytest.raises(ValueError, match="terms and max_distance need annotations"):
            r.nearest(q, terms="ec")
    assert list(table.columns) == ["id", "rank", "neighbour", "distance", "ec"]
    assert list(table["ec"]) == [ec[n] for n in table["neighbour"]]
    # k = 1: each query's nearest carries both its terms, at that distance's index
    nearest = table[table["rank"] == 1]
    expected = {(row.id, term, "", round(0.5 / (0.5 + row.distance), 2), 1)
                for row in nearest.itertuples() for term in ec[row.neighbour].split(";")}  # fmt: skip
    assert set(terms.itertuples(index=False, name=None)) == expected
