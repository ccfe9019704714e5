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
import io
import json
import logging
import sys
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from itertools import takewhile, zip_longest
from pathlib import Path
from typing import NamedTuple

import numpy as np

from ..embeddings_h5.scores import AMINO_ACIDS, COLUMN, LOGITS, PLL, residue_columns
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
    wild_type_id,
)
from ..steps.provenance import made_by_of
from ..store import read_json_object
from .reader import Embeddings

log = logging.getLogger(__name__)

ROWS_PER_PART = 1 << 22  # rows of each Parquet file (row groups of ROWS_PER_GROUP)
ROWS_PER_GROUP = 1 << 18


class InTurn:
    """Tasks run one after another in a thread of their own, one at a time: the caller builds
    the next block of rows while pyarrow (which releases the GIL) writes the last."""

    def __init__(self):
        self.pool, self.running = ThreadPoolExecutor(1), None

    def submit(self, task, *args) -> None:
        self.wait()
        self.running = self.pool.submit(task, *args)

    def wait(self) -> None:
        if self.running is not None:
            running, self.running = self.running, None
            running.result()  # raises what the task raised

    def close(self) -> None:
        try:
            self.wait()
        finally:
            self.pool.shutdown()


class ScoreWriter:
    """The TSV and the Parquet dataset, written a block of rows at a time: the table's own
    columns (`columns`, each of `types`: pyarrow's string or float64), then the scores' (each
    strategy's, esmshard.input.variants.score_columns); `made_by` (what made the scores) in the
    Parquet files' metadata. Both files are written by pyarrow, each in a
    thread of its own (InTurn): the scores as float32, in the TSV with the fewest digits that
    give the same float32 back (the Parquet's values), empty where a strategy has none."""

    def __init__(self, tsv: Path, folder: Path, columns, types, strategies, made_by: dict):
        import pyarrow as pa

        self.columns, self.types = list(columns), list(types)
        self.strategies = list(strategies)
        self.fh = pa.OSFile(str(tsv), "wb")
        header = io.StringIO()
        csv.writer(header, delimiter="\t", lineterminator="\n").writerow(
            [*self.columns, *self.strategies]
        )
        self.fh.write(header.getvalue().encode("utf-8"))
        self.folder = folder
        self.folder.mkdir()
        self.schema = pa.schema(
            [*zip(self.columns, self.types), *((name, pa.float32()) for name in self.strategies)],
            metadata={"esmshard": json.dumps(made_by)},
        )
        self.pending, self.parquet, self.in_part, self.parts = [], None, 0, 0
        self.tsv_writes, self.parquet_writes = InTurn(), InTurn()
        self.rows = 0
        self.empty = dict.fromkeys(self.strategies, 0)  # rows a strategy could not score

    def write(self, own: list, scores: dict[str, np.ndarray]) -> None:
        """Rows of the table's `own` columns (pyarrow arrays of strings, or dictionaries of
        them) and their `scores` (per strategy, NaN where it has none), into both files."""
        self.write_tsv(own, scores)
        self.write_parquet(own, scores)

    def _scores(self, scores: dict[str, np.ndarray]) -> list:
        import pyarrow as pa

        return [
            pa.array(values, pa.float32(), mask=np.isnan(values))
            for values in (np.asarray(scores[name], dtype=np.float32) for name in self.strategies)
        ]

    def write_tsv(self, own: list, scores: dict[str, np.ndarray]) -> None:
        import pyarrow as pa
        import pyarrow.csv as pcsv

        columns = self._scores(scores)
        table = pa.Table.from_arrays([*own, *columns], names=[*self.columns, *self.strategies])
        # cells quoted only in a block where one holds a tab, a quote or a line break
        quoting = "needed" if any(needs_quotes(column) for column in own) else "none"
        options = pcsv.WriteOptions(include_header=False, delimiter="\t", quoting_style=quoting)
        self.tsv_writes.submit(pcsv.write_csv, table, self.fh, options)
        for name, values in zip(self.strategies, columns):
            self.empty[name] += values.null_count
        self.rows += table.num_rows

    def write_parquet(self, own: list, scores: dict[str, np.ndarray]) -> None:
        """Rows into the Parquet dataset, whose row groups each hold ROWS_PER_GROUP rows or a
        little more: given in order of their `id`, each group's statistics bound the IDs it
        holds."""
        self.pending.append((own, self._scores(scores)))
        if sum(len(columns[0]) for columns, _ in self.pending) >= ROWS_PER_GROUP:
            self._flush()

    def _flush(self) -> None:
        """The pending rows as one row group."""
        if self.pending:
            self.parquet_writes.submit(self._write_group, self.pending)
            self.pending = []

    def _write_group(self, blocks: list) -> None:
        """Blocks of rows (each their own columns and their scores) as one row group, the
        own columns of the dataset's types."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        table = pa.concat_tables(
            pa.Table.from_arrays(
                [*(numbers(column) if kind == pa.float64() else column.cast(pa.string())
                   for column, kind in zip(own, self.types)), *scores],
                schema=self.schema,
            )
            for own, scores in blocks
        )  # fmt: skip
        if self.parquet is None or self.in_part >= ROWS_PER_PART:
            if self.parquet is not None:
                self.parquet.close()
            path = self.folder / f"part-{self.parts:05d}.parquet"
            # IDs repeat (a protein's rows): a dictionary of them; mutants hardly repeat
            self.parquet = pq.ParquetWriter(
                path,
                self.schema,
                compression="zstd",
                use_dictionary=[name for name in self.columns if name != "mutant"],
            )
            self.in_part, self.parts = 0, self.parts + 1
        self.parquet.write_table(table, row_group_size=table.num_rows)
        self.in_part += table.num_rows

    def close(self) -> None:
        import pyarrow.parquet as pq

        with contextlib.ExitStack() as closing:  # each closed, the last first, whatever raises
            closing.callback(self.fh.close)
            closing.callback(lambda: self.parquet is not None and self.parquet.close())
            closing.callback(self.parquet_writes.close)
            closing.callback(self.tsv_writes.close)
            self._flush()
        if self.parts == 0:  # no variant: the columns alone
            pq.write_table(self.schema.empty_table(), self.folder / "part-00000.parquet")


# The bytes that a TSV cell holding them must be quoted for: tab, line feed, return, quote.
QUOTED = np.zeros(256, dtype=bool)
QUOTED[list(b'\t\n\r"')] = True


def needs_quotes(column) -> bool:
    """Whether a column of strings (or a dictionary of them) has a cell that a TSV must quote."""
    import pyarrow as pa

    cells = column.dictionary if pa.types.is_dictionary(column.type) else column
    _, offsets, data = cells.buffers()
    if data is None:
        return False
    bounds = np.frombuffer(offsets, dtype=np.int32)[[cells.offset, cells.offset + len(cells)]]
    return bool(QUOTED[np.frombuffer(data, dtype=np.uint8)[bounds[0] : bounds[1]]].any())


def float32_cells(values: np.ndarray) -> list[str]:
    """Scores as the TSV writes them (ScoreWriter): float32 with the fewest digits that read
    back the same, empty for NaN."""
    import pyarrow as pa
    import pyarrow.compute as pc

    values = np.asarray(values, dtype=np.float32)
    cells = pc.cast(pa.array(values, mask=np.isnan(values)), pa.string())
    return pc.fill_null(cells, "").to_pylist()


def numbers(column):
    """A string column's cells as float64, blank ones null; raises pyarrow's ArrowInvalid
    where a cell is no number."""
    import pyarrow as pa
    import pyarrow.compute as pc

    trimmed = pc.utf8_trim_whitespace(column)
    return pc.cast(pc.if_else(pc.equal(trimmed, ""), None, trimmed), pa.float64())


def column_types(columns: list[str], own: list) -> list:
    """pyarrow's type of each of the table's own columns (`own`, string arrays) in the Parquet
    dataset: float64 where every cell is a number or blank (DMS_score), else string (id and
    mutant always)."""
    import pyarrow as pa

    def is_numeric(column) -> bool:
        try:
            numbers(column)
        except pa.ArrowInvalid:
            return False
        return True

    return [
        pa.float64() if name not in ("id", "mutant") and is_numeric(column) else pa.string()
        for name, column in zip(columns, own)
    ]


class Matrices:
    """Each strategy's log-probabilities of a protein (residues × 20), a protein at a time, as
    slices of the file's one array per kind (Embeddings.slices)."""

    def __init__(self, emb: Embeddings, strategies):
        self.sources = {
            name: emb.slices(kind) for name, kind in STRATEGIES.items() if name in strategies
        }

    def of(self, row: int) -> dict[str, np.ndarray]:
        return {
            name: np.array(values[offsets[row] : offsets[row + 1]], dtype=np.float64)
            for name, (values, offsets) in self.sources.items()
        }

    def release(self) -> None:
        """Maps the files anew: the pages read through a mapping count as the process's memory
        for as long as it lasts, so a proteome read through one would hold all of it."""
        for name, (values, offsets) in self.sources.items():
            if isinstance(values, np.memmap):
                mapped = np.memmap(values.filename, values.dtype, "r", values.offset, values.shape)
                self.sources[name] = (mapped, offsets)


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
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
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
    matrices = Matrices(emb, strategies)
    for id_, members in by_protein.items():
        record = only if id_ is None else id_
        try:
            row = emb.row(record)
        except KeyError:
            continue  # failed: failed_sequences.tsv says why
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
        for name, matrix in matrices.of(row).items():
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
    return kept, {name: values[kept] for name, values in scores.items()}


# Each wild type's 19 substitutions: the other amino acids' columns, in order.
OTHERS = np.array([[a for a in range(len(COLUMN)) if a != wild] for wild in range(len(COLUMN))])


class Substitutions(NamedTuple):
    """Every single substitution of one protein, position-major, the amino acids in order."""

    id: str
    positions: np.ndarray  # 0-based
    wild: np.ndarray  # the wild type's column (esmshard.embeddings_h5.scores.AMINO_ACIDS)
    mutant: np.ndarray  # the mutant's column
    scores: dict[str, np.ndarray]

    @classmethod
    def of(cls, id_: str, sequence: bytes) -> "Substitutions":
        """Those of `sequence`; positions holding X and the like have none (as
        esmshard.input.variants.single_substitutions)."""
        columns = residue_columns(sequence)
        at = np.flatnonzero(columns >= 0)
        positions = np.repeat(at, len(COLUMN) - 1)
        return cls(id_, positions, columns[positions], OTHERS[columns[at]].ravel(), {})


def substitution_names(positions: np.ndarray, wild: np.ndarray, mutant: np.ndarray, offset: int):
    """esmshard.input.variants.substitution_name of many substitutions at once, as a pyarrow
    string array: 0-based `positions` (those of one residue next to each other, of one wild
    type), the amino acids by their columns. Each residue's part (`H24`) is made once."""
    import pyarrow as pa
    import pyarrow.compute as pc

    def letters(columns):
        return pa.DictionaryArray.from_arrays(columns.astype(np.int8), pa.array(AMINO_ACIDS))

    starts = np.flatnonzero(np.diff(positions, prepend=-1))
    residues = pc.binary_join_element_wise(
        letters(wild[starts]).cast(pa.string()),
        pc.cast(pa.array(positions[starts] + offset), pa.string()),
        "",
    )
    residue_of = np.repeat(np.arange(len(starts)), np.diff(starts, append=len(positions)))
    return pc.binary_join_element_wise(
        residues.take(residue_of), letters(mutant).cast(pa.string()), ""
    )


def _write_substitutions(writer: ScoreWriter, block: list[Substitutions], offset: int) -> None:
    """Proteins' substitutions as rows of `id` (a dictionary of the block's IDs) and `mutant`,
    and their scores."""
    import pyarrow as pa

    counts = [len(s.positions) for s in block]
    ids = pa.DictionaryArray.from_arrays(
        np.repeat(np.arange(len(block), dtype=np.int32), counts), pa.array([s.id for s in block])
    )
    names = substitution_names(
        *(
            np.concatenate([getattr(s, field) for s in block])
            for field in ("positions", "wild", "mutant")
        ),
        offset,
    )
    scores = {name: np.concatenate([s.scores[name] for s in block]) for name in writer.strategies}
    writer.write([ids, names], scores)


def _all_substitutions(emb, inputs, strategies, plls, writer: ScoreWriter, offset: int) -> int:
    """Every single substitution of every embedded record, the records in order of their IDs
    (one protein's rows in a few row groups of the Parquet dataset, found by their statistics),
    named with its residues numbered from `offset`; the records not embedded (failed) counted.
    The rows are written a block of about ROWS_PER_GROUP at a time, built by array operations:
    a proteome's tens of millions of rows in seconds."""
    missing = 0
    lengths = emb.h5["lengths"][:]
    row_of = {id_: row for row, id_ in enumerate(emb.ids())}
    matrices = Matrices(emb, strategies)
    records = {r.id: r.sequence for path in inputs for r in read_raw(str(path))}
    block, held = [], 0
    for id_ in sorted(records):
        row = row_of.get(id_)
        if row is None:
            missing += 1
            continue
        found = Substitutions.of(id_, records.pop(id_)[: int(lengths[row])])
        for name, matrix in matrices.of(row).items():
            found.scores[name] = differences(matrix, found.positions, found.wild, found.mutant)
        if PSEUDO_PPL in strategies:
            names = substitution_names(found.positions, found.wild, found.mutant, offset)
            found.scores.update(relative_plls(id_, names.to_pylist(), plls))
        block.append(found)
        held += len(found.positions)
        if held >= ROWS_PER_GROUP:
            _write_substitutions(writer, block, offset)
            block, held = [], 0
            matrices.release()
    if block:
        _write_substitutions(writer, block, offset)
    return missing


def _cells(variant, columns: list[str], only: str) -> tuple[str, ...]:
    """A variant's row of the output's own columns: the table's cells, its record's ID first
    where the table has no `id` column (or in it, where the cell is empty)."""
    if "id" not in columns:
        return (only, *variant.cells)
    at = columns.index("id")
    return (*variant.cells[:at], variant.id or only, *variant.cells[at + 1 :])


def counts_line(counts: dict, tsv) -> str:
    """What the variants step wrote (the counts in its `variant_scores.json`), as the step's
    log and the run's last line say it: the rows, and the variants (or, of `variants: all`, the
    records) left without one."""
    line = f"variants: {counts['scored']:,} scored ({', '.join(counts['strategies'])}) in {tsv}"
    missing = counts["without_rows"]
    if missing and counts["of"] == "records":
        line += f"; {missing:,} records failed, and their substitutions have no rows"
    elif missing:
        line += (
            "; 1 variant has no row: its record failed"
            if missing == 1
            else f"; {missing:,} variants have no row: their records failed"
        )
    if missing:
        line += " (failed_sequences.tsv says why)"
    empty = {name: n for name, n in counts.get("empty", {}).items() if n}
    if empty:
        each = ", ".join(f"{name} {n:,}" for name, n in empty.items())
        line += f"; left empty where a strategy cannot score the row: {each}"
    return line


def read_counts(summary) -> dict | None:
    """The variants step's counts in its `summary` (variant_scores.json), where it has written
    them."""
    return (read_json_object(Path(summary)) or {}).get("counts")


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
    import pyarrow as pa

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
        own = [pa.array([row[k] for row in rows], pa.string()) for k in range(len(columns))]
        types = column_types(columns, own)
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
                            [column.take(kept[chosen]) for column in own],
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
    # Beside the folder, not in it: Polars reads a folder only of Parquet files.
    write_json(out_summary, {"made_by": made_by, "counts": counts})
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
                writer.writerow([*group[0][:own], *float32_cells(scores.mean(0))])
                rows += 1
        return rows
    finally:
        for fh in handles:
            fh.close()
