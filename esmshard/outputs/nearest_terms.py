"""What a search of nearest neighbours carries over, asked alike of `esmshard neighbours` and of
`Embeddings.nearest`: the neighbours' annotation columns, and every term of a column of them,
goPredSim's way (esmshard.search.transfer), per aspect of a GO release where one is given.
"""

from typing import NamedTuple

from ..search import Hits, read_annotations
from ..search.annotations import annotation_columns
from ..search.ontology import Ontology, OntologyError, ontology_problem, read_ontology
from ..search.transfer import (
    AspectTerms,
    TermTransfer,
    TransferAsked,
    aspect_masks,
    aspect_terms,
    carried_by_aspect,
    terms_of,
    transfer_terms,
    unknown_line,
)


class Carry(NamedTuple):
    """The reference's annotations (by ID; empty: none asked), how terms are carried (None:
    not asked), and with a GO release the terms by aspect and the line that counts those it
    does not hold (None: every one is there)."""

    annotations: dict
    transfer: TransferAsked | None = None
    ontology: Ontology | None = None
    by_aspect: AspectTerms | None = None
    unknown: str | None = None

    @property
    def aspects(self) -> list[str]:
        """The aspects searched apart (none without a GO release)."""
        return list(self.by_aspect.by_aspect) if self.by_aspect else []

    def aspect_rows(self, reference_ids) -> dict:
        """Which reference rows each aspect searches (none without a GO release)."""
        return aspect_masks(reference_ids, self.by_aspect) if self.by_aspect else {}


def carry_asked(annotations=None, terms=None, max_distance=None, ontology=None, k=10) -> Carry:
    """What to carry, the files read and checked; ValueError in one line where they cannot be
    (the names of the command's options and of nearest's arguments are the same words)."""
    if (terms or max_distance is not None) and annotations is None:
        raise ValueError("terms and max_distance need annotations (the reference's table)")
    if ontology and not terms:
        raise ValueError("ontology needs terms (the column of GO terms)")
    table = read_annotations(annotations) if annotations is not None else {}
    if not terms:
        return Carry(table)
    if terms not in annotation_columns(table):
        raise ValueError(
            f"{annotations} has no column {terms!r} (it has "
            f"{', '.join(annotation_columns(table))}): name the column of the terms"
        )
    asked = TransferAsked(terms, k, max_distance, str(ontology) if ontology else None)
    if not ontology:
        return Carry(table, asked)
    problem = ontology_problem(ontology)
    if problem:
        raise OntologyError(f"ontology {problem}")
    release = read_ontology(ontology)
    split = aspect_terms(terms_of(table, terms), release)
    return Carry(table, asked, release, split, unknown_line(split, terms, release, ontology))


def carried_terms(carry: Carry, hits: Hits, aspects: dict, query_ids, reference_ids, metric):
    """The terms carried to each query: from its hits, or from each aspect's own (`aspects`)."""
    counted = carry.transfer.counted()
    if carry.ontology is None:
        terms = terms_of(carry.annotations, carry.transfer.column)
        return transfer_terms(hits, query_ids, reference_ids, terms, metric, **counted)
    return carried_by_aspect(aspects, query_ids, reference_ids, carry.by_aspect, metric,
                             carry.ontology, **counted)  # fmt: skip


def terms_table(rows: list[TermTransfer]):
    """The terms carried as a pandas DataFrame: id, term, aspect, reliability, hits."""
    import pandas as pd

    return pd.DataFrame(rows, columns=list(TermTransfer._fields))
