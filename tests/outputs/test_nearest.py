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
    np.testing.assert_array_equal(blocks.rows, whole.rows)
    np.testing.assert_array_equal(blocks.distances, whole.distances)


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


def test_annotated_ids_absent_from_the_reference_are_counted_in_one_line():
    annotations = {"P1": {"go": "a"}, "X9": {"go": "b"}, "X8": {"go": "c"}}
    line = neighbours.unmatched_line(annotations, ["P1", "P2"], "go.tsv", "ref.h5")
    assert line == "2 of the 3 IDs of go.tsv are not in ref.h5 (e.g. X9): they carry nothing over"
    assert neighbours.unmatched_line(annotations, ["X8", "X9", "P1"], "go.tsv", "ref.h5") is None
