"""The record table, `shards/records.parquet`: one row per input record, in input order.

Columns: `index`, `id`, `sequence_sha256` (hex SHA-256 of the residues after the input rules),
`shard` (the part that holds the record's embedding: a shard of this run, or one of the
store's, esmshard.store), `length` (residues read), `n_residues` (residues embedded),
`truncated`, `n_replaced` (letters turned into X), `file` and `line` (where the header is) and
`description` (the header after the ID and the one space after it; a tab
between them is kept, so that the ID and the description are the header again). Parquet, written streaming in row groups: pandas,
polars and pyarrow read it (`pandas.read_parquet("shards/records.parquet")`).
"""

from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ..files import DamagedFileError

ROWS_PER_GROUP = 1 << 18
SCHEMA = pa.schema(
    [
        ("index", pa.int64()),
        ("id", pa.string()),
        ("sequence_sha256", pa.string()),
        ("shard", pa.dictionary(pa.int32(), pa.string())),
        ("length", pa.int32()),
        ("n_residues", pa.int32()),
        ("truncated", pa.bool_()),
        ("n_replaced", pa.int32()),
        ("file", pa.dictionary(pa.int32(), pa.string())),
        ("line", pa.int64()),
        ("description", pa.string()),
    ]
)
# What the shard step knows on its first pass; the rest is added when the table is written.
SCANNED = pa.schema(
    [
        SCHEMA.field(name)
        for name in (
            "id",
            "sequence_sha256",
            "length",
            "n_replaced",
            "file",
            "line",
            "description",
        )
    ]
)


def source(file: str, line: int) -> str:
    """Where a record is, as every message names it."""
    return f"{file}:{line}"


class ScanWriter:
    """The first pass's rows, buffered a row group at a time into a Parquet file."""

    def __init__(self, sink, files: list[str]):
        self.writer = pq.ParquetWriter(sink, SCANNED, compression="zstd")
        self.files = pa.array(files, pa.string())
        self.columns = {name: [] for name in SCANNED.names}
        self.rows = 0

    def add(self, id_, sha256, length, n_replaced, file_number, line, description):
        for column, value in zip(
            self.columns.values(),
            (id_, sha256, length, n_replaced, file_number, line, description),
        ):
            column.append(value)
        self.rows += 1
        if len(self.columns["id"]) == ROWS_PER_GROUP:
            self.flush()

    def flush(self):
        if not self.columns["id"]:
            return
        arrays = [
            pa.DictionaryArray.from_arrays(pa.array(values, pa.int32()), self.files)
            if name == "file"
            else pa.array(values, SCANNED.field(name).type)
            for name, values in self.columns.items()
        ]
        self.writer.write_batch(pa.record_batch(arrays, schema=SCANNED))
        self.columns = {name: [] for name in SCANNED.names}

    def close(self):
        self.flush()
        self.writer.close()


def write_table(scanned, sink, names, part_of, embedded) -> None:
    """The record table: the first pass's rows (the `scanned` files, in input order) with each
    record's index, part and residues (`embedded(rows)`: the residues embedded of those rows, and
    which are truncated)."""
    shard_names = pa.array(names, pa.string())
    batches = (b for path in scanned for b in pq.ParquetFile(path).iter_batches(ROWS_PER_GROUP))
    with pq.ParquetWriter(sink, SCHEMA, compression="zstd") as writer:
        start = 0
        for batch in batches:
            rows = slice(start, start + batch.num_rows)
            n_residues, truncated = embedded(rows)
            columns = {
                "index": pa.array(np.arange(rows.start, rows.stop, dtype=np.int64)),
                "shard": pa.DictionaryArray.from_arrays(pa.array(part_of[rows]), shard_names),
                "n_residues": pa.array(n_residues),
                "truncated": pa.array(truncated),
            }
            writer.write_batch(
                pa.record_batch(
                    [
                        columns[name] if name in columns else batch.column(name)
                        for name in SCHEMA.names
                    ],
                    schema=SCHEMA,
                )
            )
            start = rows.stop


@contextmanager
def _record_table(path):
    """Reading the record table: a damaged one (cut short, a folder, another file) in one line."""
    redo = "remove it and run the workflow again (what the store holds is reused)"
    if Path(path).is_dir():
        raise DamagedFileError(f"{path} is a folder, not the record table; {redo}")
    try:
        yield
    except pa.ArrowInvalid:
        raise DamagedFileError(
            f"{path} is cut short or not a Parquet file: not the record table esmshard's shard "
            f"step writes; {redo}"
        ) from None


def read_columns(path, columns) -> pa.Table:
    with _record_table(path):
        return pq.read_table(path, columns=list(columns))


def iter_batches(path, columns, rows: int = ROWS_PER_GROUP) -> Iterator[pa.RecordBatch]:
    with _record_table(path):
        return pq.ParquetFile(path).iter_batches(rows, columns=list(columns))


def shard_codes(table: pa.Table) -> tuple[np.ndarray, list[str]]:
    """Each record's shard as a number, and the shard names the numbers stand for."""
    chunks = table.select(["shard"]).unify_dictionaries().column("shard").chunks
    if not chunks:
        return np.zeros(0, dtype=np.int32), []
    codes = np.concatenate([chunk.indices.to_numpy(zero_copy_only=False) for chunk in chunks])
    return codes, chunks[0].dictionary.to_pylist()
