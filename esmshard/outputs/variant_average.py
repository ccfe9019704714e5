"""Average the strategies' scores of several runs' `variant_scores.tsv` (the ESM-1v ensemble)."""

import csv
from itertools import takewhile, zip_longest

import numpy as np

from ..files import atomic_path
from ..input.fasta import printable
from ..input.variants import SCORES
from .variant_writer import float32_cells


def average_scores(tables, out) -> int:
    """The mean of each strategy's scores over `tables` (variant_scores.tsv of runs of several
    models over the same variants, as the ESM-1v ensemble), written to `out`; returns the rows.
    The tables must list the same variants in the same order, with the same strategies."""
    handles = [open(path, newline="", encoding="utf-8") for path in tables]
    try:
        readers = [csv.reader(fh, delimiter="\t") for fh in handles]
        headers = [next(reader, None) for reader in readers]
        header = headers[0] or []
        # the strategies' columns end the header; the table's own columns lead
        own = len(header) - len(list(takewhile(lambda name: name in SCORES, header[::-1])))
        if any(h != header for h in headers) or not {"id", "mutant"} <= set(header[:own]):
            raise ValueError(
                "the tables' columns differ, or one is not a variant_scores.tsv: "
                + "; ".join(f"{t}: {', '.join(h or [])}" for t, h in zip(tables, headers))
            )
        key = [header.index("id"), header.index("mutant")]
        rows = 0
        with atomic_path(out) as tmp, open(tmp, "w", newline="", encoding="utf-8") as fh:
            writer = csv.writer(fh, delimiter="\t", lineterminator="\n")
            writer.writerow(header)
            for line, group in enumerate(zip_longest(*readers), start=2):
                if any(row is None for row in group):
                    short = [t for t, row in zip(tables, group) if row is None]
                    raise ValueError(f"{', '.join(short)} holds fewer variants than the others")
                if any(row[:own] != group[0][:own] for row in group):
                    differ = ", ".join(
                        f"{t}: {' '.join(r[k] for k in key)}" for t, r in zip(tables, group)
                    )
                    raise ValueError(
                        f"line {line}: the tables list other variants ({printable(differ)}); "
                        "score the same variants table in each run"
                    )
                scores = np.array([[float(v) if v else np.nan for v in r[own:]] for r in group])
                writer.writerow([*group[0][:own], *float32_cells(scores.mean(0))])
                rows += 1
        return rows
    finally:
        for fh in handles:
            fh.close()
