"""goPredSim's term transfer, from its formula: every term of every counted hit, the hits tied at
the k-th distance counted, each term's index the sum of its hits' indices over the hits counted,
rounded to 0.01, zeros dropped."""

import numpy as np
import pytest

from esmshard.search import Hits
from esmshard.search.ontology import read_ontology
from esmshard.search.transfer import (
    TermTransfer,
    aspect_terms,
    in_query_order,
    terms_of,
    transfer_terms,
)

REFERENCE = ["r0", "r1", "r2", "r3"]
TERMS = terms_of(
    {"r0": {"go": "GO:A; GO:B"}, "r1": {"go": "GO:A"}, "r2": {"go": "GO:C,GO:C"},
     "r3": {"go": "GO:A"}}, "go")  # fmt: skip


def one_query(distances) -> Hits:
    return Hits(np.array([[0, 1, 2, 3]]), np.array([distances], dtype=np.float32))


def test_the_hits_tied_at_the_kth_distance_all_count():
    found = transfer_terms(one_query([0.5, 1.0, 1.0, 2.0]), ["q"], REFERENCE, TERMS,
                           "euclidean", k=2)  # fmt: skip
    ri = [0.5 / (0.5 + d) for d in (0.5, 1.0, 1.0)]  # three hits: r2 ties with r1
    assert found == [
        TermTransfer("q", "GO:A", "", round((ri[0] + ri[1]) / 3, 2), 2),
        TermTransfer("q", "GO:B", "", round(ri[0] / 3, 2), 1),
        TermTransfer("q", "GO:C", "", round(ri[2] / 3, 2), 1),
    ]
    assert [t.reliability for t in found] == [0.28, 0.17, 0.11]


def test_all_hits_within_a_distance_count_instead_of_k():
    found = transfer_terms(one_query([0.5, 1.0, 1.0, 2.0]), ["q"], REFERENCE, TERMS,
                           "euclidean", max_distance=2.0)  # fmt: skip
    ri = [0.5 / (0.5 + d) for d in (0.5, 1.0, 1.0, 2.0)]
    assert found[0] == TermTransfer("q", "GO:A", "", round((ri[0] + ri[1] + ri[3]) / 4, 2), 3)
    assert transfer_terms(one_query([3.0, 4.0, 5.0, 6.0]), ["q"], REFERENCE, TERMS, "euclidean",
                          max_distance=2.0) == []  # fmt: skip


def test_a_term_whose_index_rounds_to_zero_is_dropped_and_cosine_is_one_minus_d():
    found = transfer_terms(one_query([0.2, 0.995, 0.999, 1.5]), ["q"], REFERENCE, TERMS,
                           "cosine", k=3)  # fmt: skip
    assert found == [
        TermTransfer("q", "GO:A", "", round((0.8 + 0.005) / 3, 2), 2),
        TermTransfer("q", "GO:B", "", round(0.8 / 3, 2), 1),
    ]  # GO:C: 0.001 / 3 rounds to 0


def test_k_or_a_distance_one_of_them():
    with pytest.raises(ValueError, match="give k or max_distance"):
        transfer_terms(one_query([1, 2, 3, 4]), ["q"], REFERENCE, TERMS, "euclidean")


SMALL_RELEASE = """format-version: 1.2
data-version: releases/test

[Term]
id: GO:A
namespace: biological_process

[Term]
id: GO:B
namespace: biological_process
is_a: GO:A ! the root

[Term]
id: GO:C
namespace: biological_process
is_a: GO:B

[Term]
id: GO:D
alt_id: GO:D2
namespace: biological_process
relationship: part_of GO:B

[Term]
id: GO:E
namespace: molecular_function

[Typedef]
id: part_of
"""


def test_gopredsims_rules_on_a_small_case(tmp_path):
    """As goPredSim's code does it: each aspect among the references annotated in it, ties at
    the k-th counted, then the terms that are an is_a ancestor of another dropped (part_of not
    followed; an alternative ID kept as written)."""
    (tmp_path / "go.obo").write_text(SMALL_RELEASE)
    ontology = read_ontology(tmp_path / "go.obo")
    terms = terms_of({"r0": {"go": "GO:B;GO:E"}, "r1": {"go": "GO:C;GO:D2"},
                      "r2": {"go": "GO:A;GO:X"}}, "go")  # fmt: skip
    split = aspect_terms(terms, ontology)
    assert split.by_aspect == {"BPO": {"r0": ["GO:B"], "r1": ["GO:C", "GO:D2"], "r2": ["GO:A"]},
                               "MFO": {"r0": ["GO:E"]}, "CCO": {}}  # fmt: skip
    assert split.unknown == ["GO:X"]
    ids = ["r0", "r1", "r2"]
    bpo = Hits(np.array([[0, 1, 2]]), np.array([[0.2, 0.4, 0.4]], dtype=np.float32))
    mfo = Hits(np.array([[0, -1, -1]]), np.array([[0.2, np.inf, np.inf]], dtype=np.float32))
    found = in_query_order(
        ["q"],
        transfer_terms(bpo, ["q"], ids, split.by_aspect["BPO"], "cosine", k=2, aspect="BPO",
                       ontology=ontology),
        transfer_terms(mfo, ["q"], ids, split.by_aspect["MFO"], "cosine", k=2, aspect="MFO",
                       ontology=ontology),
    )  # fmt: skip
    # BPO: three hits (r2 ties with r1); B (0.27) and A (0.2) are ancestors of C
    assert found == [
        TermTransfer("q", "GO:C", "BPO", 0.2, 1),
        TermTransfer("q", "GO:D2", "BPO", 0.2, 1),
        TermTransfer("q", "GO:E", "MFO", 0.8, 1),
    ]
