"""Annotation transfer as goPredSim does it (Littmann et al. 2021; FANTASIA the same): every term
of every hit counted, each term's reliability index the sum over the hits that carry it of each
hit's reliability index (esmshard.search.reliability), divided by the number of hits counted.

The hits counted are a query's k nearest, all of those tied at the k-th distance among them
(`k`), or all within a distance (`max_distance`). Indices are rounded to 0.01 and a term whose
index rounds to 0 is dropped. goPredSim's published code scales a euclidean distance d by
1 / (1 + d); its paper and EAT by 0.5 / (0.5 + d), which esmshard uses throughout.
"""

import re
from typing import NamedTuple

import numpy as np

from ..files import write_parquet, write_tsv
from .exact import Hits
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

    def counted(self) -> dict:
        """`transfer_terms`' keyword of the hits counted."""
        if self.max_distance is not None:
            return {"max_distance": self.max_distance}
        return {"k": self.k}

    def card(self) -> dict:
        """What the transfer's Parquet file says of it."""
        return {"terms": self.column, **self.counted()}


class TermTransfer(NamedTuple):
    """One term carried to a query: its reliability index and how many counted hits carry it."""

    id: str
    term: str
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
) -> list[TermTransfer]:
    """Every query's terms with their reliability index, highest first, by goPredSim's rule;
    `hits` nearest first, holding more than `k` where ties past the k-th may count."""
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
            TermTransfer(query, term, round(sum(values) / n, DECIMALS), len(values))
            for term, values in sums.items()
        ]
        found += sorted(
            (t for t in kept if t.reliability > 0), key=lambda t: (-t.reliability, t.term)
        )
    return found


def write_transfer(tsv: str, parquet: str | None, rows: list[TermTransfer], card: dict) -> None:
    """The carried terms as a TSV and (where `parquet` names one) its Parquet twin, whose
    metadata is `card` (model, layer, metric, reference, k, how the hits were counted)."""
    write_tsv(tsv, list(TermTransfer._fields), rows)
    if parquet is not None:
        types = ["string", "string", "float32", "int32"]
        write_parquet(parquet, dict(zip(TermTransfer._fields, types)), rows, card)
