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
import csv
import json
import logging
import sys
from collections import defaultdict
from itertools import takewhile, zip_longest
from pathlib import Path

import numpy as np

from ..embeddings_h5.scores import COLUMN, LOGITS, PLL, residue_columns
from ..files import atomic_path, write_json
from ..input.changes import one_pass_pll
from ..input.fasta import printable, read_raw
from ..input.variants import (
    ALL,
    ORDER,
    PLLR,
    PSEUDO_PPL,
    SCORES,
    STRATEGIES,
    WILD_TYPE_PLL,
    Table,
    change_of,
    mutant_id,
    pllr_sequences,
    read_table,
    score_columns,
    sequences_of,
    single_substitutions,
    substitution_name,
    wild_type_id,
)
from ..steps.provenance import made_by_of
from ..store import read_json_object
from .reader import Embeddings

log = logging.getLogger(__name__)

# The step's counts, beside the Parquet parts (a leading _: dataset readers skip it).
COUNTS = "_counts.json"
MADE_BY = "_made_by.json"  # what made the scores: the model, its weights, the settings key
ROWS_PER_PART = 1 << 22  # rows of each Parquet file (row groups of ROWS_PER_GROUP)
ROWS_PER_GROUP = 1 << 18


class ScoreWriter:
    """The TSV and the Parquet dataset, written a block of rows at a time: the table's own
    columns (`columns`, each of `types`: pyarrow's string or float64), then the scores' (each
    strategy's, esmshard.input.variants.score_columns); `made_by` (what made the scores) in the
    Parquet files' metadata and `_made_by.json`."""

    def __init__(self, tsv: Path, folder: Path, columns, types, strategies, made_by: dict):
        import pyarrow as pa

        self.columns, self.types = list(columns), list(types)
        self.strategies = list(strategies)
        self.fh = open(tsv, "w", newline="", encoding="utf-8")
        self.tsv = csv.writer(self.fh, delimiter="\t", lineterminator="\n")
        self.tsv.writerow([*self.columns, *self.strategies])
        self.folder = folder
        self.folder.mkdir()
        write_json(folder / MADE_BY, made_by)
        self.schema = pa.schema(
            [*zip(self.columns, self.types), *((name, pa.float32()) for name in self.strategies)],
            metadata={"esmshard": json.dumps(made_by)},
        )
        self.pending, self.parquet, self.in_part, self.parts = [], None, 0, 0
        self.rows = 0
        self.empty = dict.fromkeys(self.strategies, 0)  # rows a strategy could not score

    def write(self, cells: list[tuple], scores: dict[str, np.ndarray]) -> None:
        """Rows of the table's own `cells` (a tuple per row, a cell per column) and their
        `scores` (per strategy, NaN where it has none), into both files."""
        self.write_tsv(cells, scores)
        self.write_parquet(cells, scores)

    def write_tsv(self, cells: list[tuple], scores: dict[str, np.ndarray]) -> None:
        columns = [scores[name] for name in self.strategies]
        self.tsv.writerows(
            [*row, *(f"{v:.7g}" if v == v else "" for v in values)]  # NaN: left empty
            for row, *values in zip(cells, *columns)
        )
        for name, values in zip(self.strategies, columns):
            self.empty[name] += int(np.isnan(values).sum())
        self.rows += len(cells)

    def write_parquet(self, cells: list[tuple], scores: dict[str, np.ndarray]) -> None:
        """Rows into the Parquet dataset, whose row groups each hold ROWS_PER_GROUP rows or a
        little more: given in order of their `id`, each group's statistics bound the IDs it
        holds."""
        self.pending.append((cells, [scores[name] for name in self.strategies]))
        if sum(len(p[0]) for p in self.pending) >= ROWS_PER_GROUP:
            self._flush()

    def _flush(self) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        if not self.pending:
            return
        cells = [row for p in self.pending for row in p[0]]
        scores = [
            np.concatenate([p[1][k] for p in self.pending]).astype(np.float32)
            for k in range(len(self.strategies))
        ]
        self.pending = []
        if self.parquet is None or self.in_part >= ROWS_PER_PART:
            if self.parquet is not None:
                self.parquet.close()
            path = self.folder / f"part-{self.parts:05d}.parquet"
            self.parquet = pq.ParquetWriter(path, self.schema)
            self.in_part, self.parts = 0, self.parts + 1
        own = [
            pa.array([row[k] for row in cells], pa.string())
            if kind == pa.string()
            else pa.array([float(row[k]) if row[k].strip() else None for row in cells], kind)
            for k, kind in enumerate(self.types)
        ]
        table = pa.Table.from_arrays(
            [*own, *(pa.array(c, pa.float32(), mask=np.isnan(c)) for c in scores)],
            schema=self.schema,
        )
        self.parquet.write_table(table)
        self.in_part += len(cells)

    def close(self) -> None:
        import pyarrow.parquet as pq

        self._flush()
        if self.parquet is not None:
            self.parquet.close()
        else:  # no variant: the columns alone
            pq.write_table(self.schema.empty_table(), self.folder / "part-00000.parquet")
        self.fh.close()


def column_types(columns: list[str], rows: list[tuple]) -> list:
    """pyarrow's type of each of the table's own columns in the Parquet dataset: float64 where
    every cell is a number or empty (DMS_score), else string (id and mutant always)."""
    import pyarrow as pa

    def number(cell: str) -> bool:
        try:
            float(cell)
        except ValueError:
            return not cell.strip()
        return True

    return [
        pa.float64()
        if name not in ("id", "mutant") and all(number(row[k]) for row in rows)
        else pa.string()
        for k, name in enumerate(columns)
    ]


def _matrices(emb: Embeddings, protein, strategies) -> dict[str, np.ndarray]:
    """Each strategy's log-probabilities of one protein: residues × 20."""
    return {
        name: np.asarray(emb.values(protein, kind), dtype=np.float64)
        for name, kind in STRATEGIES.items()
        if name in strategies
    }


def differences(matrix: np.ndarray, positions, wild, mutant) -> np.ndarray:
    """log p(mutant) − log p(wild type) of substitutions at 0-based `positions` of one
    protein's log-probabilities (residues × 20), the amino acids by their columns."""
    return matrix[positions, mutant] - matrix[positions, wild]


def pseudo_ppls(mutants: Embeddings | None) -> dict[str, float]:
    """Each mutant sequence's pseudo-log-likelihood by its ID (`mutant_id`); none without
    `pseudo_ppl`."""
    if mutants is None or not len(mutants):
        return {}
    return dict(zip(mutants.ids(), mutants.array(PLL)[:, 0].astype(np.float64).tolist()))


def relative_plls(record: str, mutants: list[str], plls: dict) -> dict[str, np.ndarray]:
    """`pseudo_ppl` of a record's variants (`mutants`, as the table writes them): each mutant
    sequence's pseudo-log-likelihood minus its wild type's, a log-ratio where higher is fitter
    as the other strategies' are; and the wild type's own (NaN where there is none)."""
    wild = plls.get(wild_type_id(record), np.nan)
    own = np.array([plls.get(mutant_id(record, m), np.nan) for m in mutants], dtype=np.float64)
    return {PSEUDO_PPL: own - wild, WILD_TYPE_PLL: np.full(len(mutants), wild)}


def pllr_of(mutants: Embeddings, window: int):
    """`pllr` of a record's variant, from the mutants' run's logits: the one-pass PLL of its
    mutant minus its wild type's, both cropped to `window` residues around the change
    (esm-variants' `get_PLLR`); NaN for a stop-gain or sequences not computed."""

    def pllr(record: str, variant, sequence: str) -> float:
        change = change_of(variant, sequence)
        if change is None:
            return np.nan
        (wild_id, wild), (mutant_id_, mutant) = pllr_sequences(record, variant, change, window)
        try:
            own = one_pass_pll(mutants.values(mutant_id_, LOGITS), mutant)
            return own - one_pass_pll(mutants.values(wild_id, LOGITS), wild)
        except KeyError:  # failed in the mutants' run
            return np.nan

    return pllr


def least_from(matrix: np.ndarray, wild: np.ndarray) -> np.ndarray:
    """Per 0-based position p of one protein's log-probabilities (residues × 20, `wild` each
    residue's column, -1 for none of the 20): the least log p(a) − log p(wild type) over the 20
    amino acids at p and every position after it. A stop-gain at p scores this, as esm-variants'
    `get_minLLR` does; positions holding X and the like count for none."""
    at = np.arange(len(wild))
    lowest = np.where(wild >= 0, matrix.min(1) - matrix[at, np.maximum(wild, 0)], np.inf)
    return np.minimum.accumulate(lowest[::-1])[::-1]


def _table_scores(
    emb, variants, strategies, plls, only: str, sequences: dict[str, str], pllr=None
) -> tuple[list[int], dict[str, np.ndarray]]:
    """The variants' scores, a protein at a time (each variant the sum over its
    substitutions, a stop-gain `least_from` its position, `pllr(record, variant, sequence)`
    its pllr; a variant without an ID is of `only`, the input's one record, and `sequences`
    holds the records of stop-gains and pllr's); the variants whose record has no embedding
    (failed) left out of the returned indices."""
    by_protein = defaultdict(list)
    for k, variant in enumerate(variants):
        by_protein[variant.id].append(k)
    scores = {name: np.full(len(variants), np.nan) for name in score_columns(strategies)}
    scored = np.zeros(len(variants), dtype=bool)
    for id_, members in by_protein.items():
        record = only if id_ is None else id_
        try:
            row = emb.row(record)
        except KeyError:
            continue  # failed: failed_sequences.tsv says why
        matrices = _matrices(emb, row, strategies)
        if PSEUDO_PPL in strategies:
            relative = relative_plls(record, [variants[k].label for k in members], plls)
            for name, values in relative.items():
                scores[name][members] = values
        if PLLR in strategies:
            scores[PLLR][members] = [pllr(record, variants[k], sequences[record]) for k in members]
        stops = [k for k in members if variants[k].stop]
        # the records' own scores: of substitutions (a mutated_sequence alone has none)
        changes = [k for k in members if not variants[k].stop and variants[k].substitutions]
        substitutions = [s for k in changes for s in variants[k].substitutions]
        variant_of = np.repeat(
            np.array(changes, dtype=np.int64), [len(variants[k].substitutions) for k in changes]
        )
        positions = np.array([s.position - 1 for s in substitutions], dtype=np.int64)
        wild = np.array([COLUMN[s.wild] for s in substitutions], dtype=np.int64)
        mutant = np.array([COLUMN[s.mutant] for s in substitutions], dtype=np.int64)
        for name, matrix in matrices.items():
            summed = np.bincount(
                variant_of,
                differences(matrix, positions, wild, mutant),
                minlength=len(variants),
            )
            scores[name][changes] = summed[changes]
            if stops:
                least = least_from(matrix, residue_columns(sequences[record]))
                scores[name][stops] = least[[variants[k].stop - 1 for k in stops]]
        scored[members] = True
    kept = np.flatnonzero(scored)
    return kept.tolist(), {name: values[kept] for name, values in scores.items()}


def _all_substitutions(emb, inputs, strategies, plls, writer: ScoreWriter, offset: int) -> int:
    """Every single substitution of every embedded record, the records in order of their IDs
    (one protein's rows in a few row groups of the Parquet dataset, found by their statistics),
    named with its residues numbered from `offset`; the records not embedded (failed) counted."""
    missing = 0
    lengths = emb.h5["lengths"]
    records = {r.id: r.sequence for path in inputs for r in read_raw(str(path))}
    for id_ in sorted(records):
        try:
            row = emb.row(id_)
        except KeyError:
            missing += 1
            continue
        sequence = records.pop(id_)[: int(lengths[row])].decode("ascii")
        substitutions = single_substitutions(sequence)  # X and the like have no score
        positions = np.array([p for p, _ in substitutions], dtype=np.int64)
        column = np.array([COLUMN[a] for _, a in substitutions], dtype=np.int64)
        wild = residue_columns(sequence)[positions]
        mutants = [substitution_name(sequence, p, a, offset) for p, a in substitutions]
        scores = {
            name: differences(matrix, positions, wild, column)
            for name, matrix in _matrices(emb, row, strategies).items()
        }
        if PSEUDO_PPL in strategies:
            scores.update(relative_plls(id_, mutants, plls))
        writer.write([(id_, mutant) for mutant in mutants], scores)
    return missing


def _cells(variant, columns: list[str], only: str) -> tuple[str, ...]:
    """A variant's row of the output's own columns: the table's cells, its record's ID first
    where the table has no `id` column (or in it, where the cell is empty)."""
    if "id" not in columns:
        return (only, *variant.cells)
    at = columns.index("id")
    return (*variant.cells[:at], variant.id or only, *variant.cells[at + 1 :])


def counts_line(counts: dict, tsv) -> str:
    """What the variants step wrote (its COUNTS), as the step's log and the run's last line say
    it: the rows, and the variants (or, of `variants: all`, the records) left without one."""
    line = f"variants: {counts['scored']:,} scored ({', '.join(counts['strategies'])}) in {tsv}"
    missing = counts["without_rows"]
    if missing and counts["of"] == "records":
        line += f"; {missing:,} records failed, and their substitutions have no rows"
    elif missing:
        line += (
            f"; {missing:,} variant{'s' if missing != 1 else ''} have no row: their records failed"
        )
    if missing:
        line += " (failed_sequences.tsv says why)"
    empty = {name: n for name, n in counts.get("empty", {}).items() if n}
    if empty:
        each = ", ".join(f"{name} {n:,}" for name, n in empty.items())
        line += f"; left empty where a strategy cannot score the row: {each}"
    return line


def read_counts(folder) -> dict | None:
    """The variants step's counts in its Parquet folder, where it has written them."""
    return read_json_object(Path(folder) / COUNTS)


def score_variants(
    embeddings,
    inputs,
    variants,
    strategies,
    out_tsv,
    out_folder,
    mutants=None,
    offset=1,
    window=1022,
) -> int:
    """Score `variants` (a table's path numbering residues from `offset`, or "all") with
    `strategies` from `embeddings` (and `pseudo_ppl` and `pllr` from the mutants'
    embeddings.h5, `mutants`; pllr's crops of `window` residues); returns the rows written.
    The table's own columns are kept, in its order (with `id` first where it has none), the
    strategies' after them."""
    strategies = [name for name in ORDER if name in strategies]
    made_by = {**(made_by_of(embeddings) or {}), "variant_offset": offset}
    if variants == ALL:
        table, problems = Table(["id", "mutant"], []), []
    else:
        table, problems = read_table(variants, offset)
    if problems:  # checked before any job: the table changed since
        raise ValueError("; ".join(problems))
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
        rows = [_cells(v, table.columns, only) for v in table.variants]
        types = column_types(columns, rows)
        writer = ScoreWriter(
            Path(tsv), Path(folder), columns, types, score_columns(strategies), made_by
        )
        try:
            if variants == ALL:
                missing = _all_substitutions(emb, inputs, strategies, plls, writer, offset)
                of = "records"
            else:
                found = table.variants
                wanted = {v.id or only for v in found if v.stop or pllr}
                sequences = sequences_of(inputs, wanted) if wanted else {}
                kept, scores = _table_scores(emb, found, strategies, plls, only, sequences, pllr)
                # the TSV in the table's order, the Parquet dataset in its IDs' (stable)
                by_id = sorted(range(len(kept)), key=lambda k: found[kept[k]].id or only)
                for order, write in ((range(len(kept)), writer.write_tsv),
                                     (by_id, writer.write_parquet)):  # fmt: skip
                    order = np.asarray(order, dtype=np.int64)
                    for start in range(0, len(order), ROWS_PER_GROUP):
                        chosen = order[start : start + ROWS_PER_GROUP]
                        write(
                            [rows[kept[k]] for k in chosen],
                            {name: values[chosen] for name, values in scores.items()},
                        )
                missing = len(found) - len(kept)
                of = "variants"
        finally:
            writer.close()
        counts = {
            "scored": writer.rows,
            "strategies": strategies,
            "without_rows": missing,
            "of": of,
            "empty": writer.empty,  # per strategy: rows it could not score (stop-gains' pseudo_ppl)
        }
        write_json(Path(folder) / COUNTS, counts)
    message = counts_line(counts, out_tsv)
    log.info("%s", message)
    print(message, file=sys.stderr, flush=True)
    return writer.rows


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
                mean = scores.mean(0)
                writer.writerow([*group[0][:own], *(f"{v:.7g}" if v == v else "" for v in mean)])
                rows += 1
        return rows
    finally:
        for fh in handles:
            fh.close()
