"""Write the variants' scores: `variant_scores.tsv` and the same rows as a Parquet dataset
(`variant_scores/`), and the counts that the step's last line says.
"""

import contextlib
import csv
import io
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from ..store import read_json_object

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
