"""Variant effects: each variant's scores from embeddings.h5's logits and masked marginals,
written to `variant_scores.tsv` and the same rows as a Parquet dataset (`variant_scores/`).

A strategy's score of a variant is fair-esm's `predict.py` `label_row` arithmetic, as ProteinGym
computes it: the sum over its substitutions of log p(mutant) − log p(wild type) at the
substitution's position, from the one-pass logits (`wt_marginals`) or from the position masked
(`masked_marginals`); a stop-gain's, the least such score from its position to the end
(esm-variants' `get_minLLR`). `pseudo_ppl` is the mutant sequence's pseudo-log-likelihood (the
sum over its residues of each one's log-probability with it masked) minus its wild type's, both
read from the mutants' run (esmshard.input.variants.write_mutants). Nothing runs on a GPU
here: a new table over proteins already embedded re-runs this step alone (with `pseudo_ppl`,
the mutants' run computes the new mutants).
"""

import contextlib
import logging
import sys
from pathlib import Path

import numpy as np

from ..compute.provenance import made_by_of
from ..files import atomic_path, write_json
from ..input.variants import (
    ALL,
    ORDER,
    PLLR,
    PSEUDO_PPL,
    Table,
    read_table,
    score_columns,
    sequences_of,
)
from ..outputs.reader import Embeddings
from ..outputs.variant_writer import ROWS_PER_GROUP, ScoreWriter, column_types, counts_line
from .variant_strategies import pllr_of, pseudo_ppls, table_scores
from .variant_substitutions import all_substitutions

log = logging.getLogger(__name__)


def _cells(variant, columns: list[str], only: str) -> tuple[str, ...]:
    """A variant's row of the output's own columns: the table's cells, its record's ID first
    where the table has no `id` column (or in it, where the cell is empty)."""
    if "id" not in columns:
        return (only, *variant.cells)
    at = columns.index("id")
    return (*variant.cells[:at], variant.id or only, *variant.cells[at + 1 :])


def score_variants(
    embeddings,
    inputs,
    variants,
    strategies,
    out_tsv,
    out_folder,
    out_summary,
    mutants=None,
    offset=1,
    window=1022,
) -> int:
    """Score `variants` (a table's path numbering residues from `offset`, or "all") with
    `strategies` from `embeddings` into `out_tsv` and the Parquet folder `out_folder`, what made
    them and the counts into `out_summary` (and `pseudo_ppl` and `pllr` from the mutants'
    embeddings.h5, `mutants`; pllr's crops of `window` residues); returns the rows written.
    The table's own columns are kept, in its order (with `id` first where it has none), the
    strategies' after them."""
    strategies = [name for name in ORDER if name in strategies]
    made_by = {**(made_by_of(embeddings) or {}), "variant_offset": offset}
    table = variants_table(variants, offset)
    columns = table.columns if "id" in table.columns else ["id", *table.columns]
    with (
        Embeddings(embeddings) as emb,
        Embeddings(mutants) if mutants else contextlib.nullcontext() as mutant_emb,
        atomic_path(out_tsv) as tsv,
        atomic_path(out_folder) as folder,
    ):
        plls = pseudo_ppls(mutant_emb) if PSEUDO_PPL in strategies else {}
        pllr = pllr_of(mutant_emb, window) if PLLR in strategies else None
        only = emb.ids(0, 1)[0] if len(emb) else ""  # the input's one record
        own = own_columns(table, columns, only)
        writer = ScoreWriter(Path(tsv), Path(folder), columns, column_types(columns, own),
                             score_columns(strategies), made_by)  # fmt: skip
        try:
            if variants == ALL:
                missing = all_substitutions(emb, inputs, strategies, plls, writer, offset)
            else:
                wanted = {v.id or only for v in table.variants if v.stop or pllr}
                sequences = sequences_of(inputs, wanted) if wanted else {}
                scored = table_scores(emb, table.variants, strategies, plls, only, sequences, pllr)
                missing = write_table_rows(writer, table.variants, own, scored, only)
        finally:
            writer.close()
    counts = {
        "scored": writer.rows,
        "strategies": strategies,
        "without_rows": missing,
        "of": "records" if variants == ALL else "variants",
        "empty": writer.empty,  # per strategy: rows it could not score (stop-gains' pseudo_ppl)
    }
    # Beside the folder, not in it: Polars reads a folder only of Parquet files.
    write_json(out_summary, {"made_by": made_by, "counts": counts})
    message = counts_line(counts, out_tsv)
    log.info("%s", message)
    print(message, file=sys.stderr, flush=True)
    return writer.rows


def variants_table(variants, offset: int) -> Table:
    """The variants table at path `variants` (residues numbered from `offset`), or an empty one
    for `variants: all`; ValueError where it changed since the run's checks."""
    if variants == ALL:
        return Table(["id", "mutant"], [])
    table, problems = read_table(variants, offset)
    if problems:  # checked before any job: the table changed since
        raise ValueError("; ".join(problems))
    return table


def own_columns(table: Table, columns: list[str], only: str) -> list:
    """The table's own cells as Arrow string columns, in the output's `columns`."""
    import pyarrow as pa

    rows = [_cells(v, table.columns, only) for v in table.variants]
    return [pa.array([row[k] for row in rows], pa.string()) for k in range(len(columns))]


def write_table_rows(writer: ScoreWriter, found: list, own: list, scored, only: str) -> int:
    """Write the table's scored rows (`scored`: the kept rows' indices, their scores): the TSV
    in the table's order, the Parquet dataset in its IDs' (stable); returns the rows left
    without scores."""
    kept, scores = scored
    by_id = sorted(range(len(kept)), key=lambda k: found[kept[k]].id or only)
    for order, write in ((range(len(kept)), writer.write_tsv), (by_id, writer.write_parquet)):
        order = np.asarray(order, dtype=np.int64)
        for start in range(0, len(order), ROWS_PER_GROUP):
            chosen = order[start : start + ROWS_PER_GROUP]
            write(
                [column.take(kept[chosen]) for column in own],
                {name: values[chosen] for name, values in scores.items()},
            )
    return len(found) - len(kept)
