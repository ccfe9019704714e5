"""Annotation transfer as goPredSim does it (Littmann et al. 2021; FANTASIA the same): every term
of every hit counted, each term's reliability index the sum over the hits that carry it of each
hit's reliability index (esmshard.search.reliability), divided by the number of hits counted.

The hits counted are a query's k nearest, all of those tied at the k-th distance among them
(`k`), or all within a distance (`max_distance`). Indices are rounded to 0.01 and a term whose
index rounds to 0 is dropped. With a GO release (esmshard.search.ontology), each aspect is
searched among the references annotated in it, with their terms of that aspect alone, and a
query keeps only its most specific terms (none an ancestor of another by is_a). goPredSim's published code scales a euclidean distance d by
1 / (1 + d); its paper and EAT by 0.5 / (0.5 + d), which esmshard uses throughout.
"""

import re
from typing import NamedTuple

import numpy as np

from ..files import write_parquet, write_tsv
from .exact import Hits
from .ontology import ASPECTS, Ontology
from .reliability import reliability_index

TERMS_SEPARATED = re.compile(r"[;,]")  # GOA's and UniProt's lists of terms
DECIMALS = 2
TIES_SEARCHED = 16  # hits searched past k, that those tied with the k-th may count


class TransferAsked(NamedTuple):
    """How terms are carried: the annotations' column of terms, and the hits counted: the `k`
    nearest and those tied with the k-th, or (`max_distance` given) all within it."""

    column: str
    k: int
    max_distance: float | None = None
    ontology: str | None = None  # a GO release's OBO file

    def counted(self) -> dict:
        """`transfer_terms`' keyword of the hits counted."""
        if self.max_distance is not None:
            return {"max_distance": self.max_distance}
        return {"k": self.k}

    def card(self, ontology: "Ontology | None" = None) -> dict:
        """What the transfer's Parquet file says of it (and of the release read, if any)."""
        release = (
            {"ontology": self.ontology, "ontology_version": ontology.version} if ontology else {}
        )
        return {"terms": self.column, **self.counted(), **release}


class TermTransfer(NamedTuple):
    """One term carried to a query: its reliability index and how many counted hits carry it."""

    id: str
    term: str
    aspect: str  # BPO, MFO or CCO with an ontology; empty without
    reliability: float
    hits: int


def terms_of(annotations: dict[str, dict[str, str]], column: str) -> dict[str, list[str]]:
    """Each reference ID's terms in `column`: its values split at `;` or `,`, blanks dropped."""
    return {
        id_: [t for t in (part.strip() for part in TERMS_SEPARATED.split(v[column])) if t]
        for id_, v in annotations.items()
    }


def counted(distances: np.ndarray, k: int | None, max_distance: float | None) -> np.ndarray:
    """Which of a query's hits (its distances, nearest first) count: the `k` nearest and any tied
    with the k-th, or all within `max_distance`."""
    found = np.isfinite(distances)
    if max_distance is not None:
        return found & (distances <= max_distance)
    if not found.any():
        return found
    kth = distances[found][:k][-1]
    return found & (distances <= kth)


def transfer_terms(
    hits: Hits,
    query_ids,
    reference_ids,
    terms: dict[str, list[str]],
    metric: str,
    k: int | None = None,
    max_distance: float | None = None,
    aspect: str = "",
    ontology: Ontology | None = None,
) -> list[TermTransfer]:
    """Every query's terms with their reliability index, highest first, by goPredSim's rule;
    `hits` nearest first, holding more than `k` where ties past the k-th may count. With
    `ontology`, only the most specific of a query's terms are kept, labelled `aspect`."""
    if (k is None) == (max_distance is None):
        raise ValueError("give k or max_distance, one of them")
    found = []
    for query, rows, distances in zip(query_ids, hits.rows, hits.distances):
        mask = counted(distances, k, max_distance)
        if not mask.any():
            continue
        ri = reliability_index(distances[mask], metric)
        sums: dict[str, list[float]] = {}
        for row, index in zip(rows[mask], ri):
            for term in dict.fromkeys(terms.get(reference_ids[row], [])):
                sums.setdefault(term, []).append(float(index))
        n = int(mask.sum())
        kept = [
            TermTransfer(query, term, aspect, round(sum(values) / n, DECIMALS), len(values))
            for term, values in sums.items()
        ]
        kept = [t for t in kept if t.reliability > 0]
        if ontology is not None:
            specific = ontology.most_specific({t.term for t in kept})
            kept = [t for t in kept if t.term in specific]
        found += sorted(kept, key=lambda t: (-t.reliability, t.term))
    return found


class AspectTerms(NamedTuple):
    """A reference's terms split by aspect, and the terms the ontology does not hold."""

    by_aspect: dict[str, dict[str, list[str]]]  # aspect: each reference ID's terms in it
    unknown: list[str]


def aspect_terms(terms: dict[str, list[str]], ontology: Ontology) -> AspectTerms:
    """Each aspect's references and their terms of that aspect (a reference with none is not
    searched in it, as goPredSim does); terms the release does not hold are left out."""
    by_aspect = {aspect: {} for aspect in ASPECTS.values()}
    unknown = set()
    for id_, listed in terms.items():
        for term in listed:
            aspect = ontology.aspect(term)
            if aspect:
                by_aspect[aspect].setdefault(id_, []).append(term)
            else:
                unknown.add(term)
    return AspectTerms(by_aspect, sorted(unknown))


def aspect_masks(reference_ids, split: AspectTerms) -> dict[str, np.ndarray]:
    """Which reference rows each aspect searches: those with a term of it."""
    return {
        aspect: np.fromiter((id_ in held for id_ in reference_ids), bool, len(reference_ids))
        for aspect, held in split.by_aspect.items()
    }


def carried_by_aspect(
    hits: dict[str, Hits], query_ids, reference_ids, split: AspectTerms, metric: str,
    ontology: Ontology, **counted,
) -> list[TermTransfer]:  # fmt: skip
    """The terms carried from each aspect's own hits (`hits`, by aspect), each query's
    together; `counted`: k or max_distance."""
    return in_query_order(query_ids, *(
        transfer_terms(hits[aspect], query_ids, reference_ids, held, metric, **counted,
                       aspect=aspect, ontology=ontology)
        for aspect, held in split.by_aspect.items()
    ))  # fmt: skip


def unknown_line(found: AspectTerms, column: str, ontology: Ontology, path) -> str | None:
    """What the log says of terms the release does not hold, or None."""
    n = len(found.unknown)
    if not n:
        return None
    return (
        f"{n:,} {'term' if n == 1 else 'terms'} of {column} {'is' if n == 1 else 'are'} not in "
        f"{path} (release {ontology.version}), e.g. {found.unknown[0]}: not carried (a term of "
        "another release, or not a GO term?)"
    )


def in_query_order(query_ids, *aspects: list[TermTransfer]) -> list[TermTransfer]:
    """The terms of every aspect, each query's together in the queries' order, by aspect."""
    position = {id_: i for i, id_ in enumerate(query_ids)}
    rows = [t for found in aspects for t in found]
    return sorted(rows, key=lambda t: (position[t.id], t.aspect, -t.reliability, t.term))


def write_transfer(tsv: str, parquet: str | None, rows: list[TermTransfer], card: dict) -> None:
    """The carried terms as a TSV and (where `parquet` names one) its Parquet twin, whose
    metadata is `card` (model, layer, metric, reference, k, how the hits were counted)."""
    write_tsv(tsv, list(TermTransfer._fields), rows)
    if parquet is not None:
        types = ["string", "string", "string", "float32", "int32"]
        write_parquet(parquet, dict(zip(TermTransfer._fields, types)), rows, card)
