"""Write a Parquet dataset of one row per protein, a folder of `part-NNNNN.parquet` files."""

import json

import numpy as np

from ...embeddings_h5 import attentions, contacts
from ...embeddings_h5.representations import KINDS
from ...store.shardfile import dataset
from ..reader import Embeddings
from .blocks import Block, Options, blocks

# The Parquet dataset's files: each of about this many bytes of values, so that readers share
# the files out between their threads and no file grows without bound.
PARQUET_FILE_BYTES = 1 << 30


def parquet_schema(emb: Embeddings, kinds: dict[str, list[int]], scores=()):
    """The Parquet dataset's columns: `id`, `sequence_sha256`, `length`, `<kind>_<layer>`
    (fixed_size_list<float, D>, per residue list<fixed_size_list<float, D>>) and the `scores`
    by name, with the run's card as schema metadata."""
    import pyarrow as pa

    def column(name: str, kind: str):
        """A vector of D values as a fixed-size list (Polars reads a column of them as a 2-D
        array); a protein's rows of them, per residue, as a list of those."""
        stored = emb.stored(name)
        vector = pa.list_(pa.from_numpy_dtype(stored.dtype), stored.shape[1])
        return pa.list_(vector) if KINDS[kind].per_residue else vector

    fields = [("id", pa.string()), ("sequence_sha256", pa.string()), ("length", pa.int32())]
    for kind, layers in kinds.items():
        fields += [(f"{kind}_{layer}", column(dataset(kind, layer), kind)) for layer in layers]
    fields += [(name, column(KINDS[name].values, name)) for name in scores]
    return pa.schema(fields, metadata={b"esmshard": json.dumps(emb.made_by).encode()})


def parquet_table(block: Block, schema):
    """A block's proteins as one Parquet row group."""
    import pyarrow as pa

    def vectors(values: np.ndarray):
        return pa.FixedSizeListArray.from_arrays(pa.array(values.reshape(-1)), values.shape[1])

    columns = [pa.array(block.ids), pa.array(block.sha256), pa.array(block.lengths, pa.int32())]
    for kind, layers in block.values.items():
        for values in layers.values():
            column = vectors(values)
            if KINDS[kind].per_residue:
                offsets = pa.array(block.residue_offsets.astype(np.int32))
                column = pa.ListArray.from_arrays(offsets, column)
            columns.append(column)
    for name in schema.names[len(columns) :]:  # the scores
        values, offsets = block.unlayered[name]
        column = vectors(values)
        if offsets is not None:
            column = pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), column)
        columns.append(column)
    return pa.Table.from_arrays(columns, schema=schema)


def write_parquet(emb, target, bar, options: Options):
    """A folder of Parquet files, `part-00000.parquet` on, each of about PARQUET_FILE_BYTES in
    row groups of one block (at most PROTEINS_PER_BLOCK proteins, about BLOCK_BYTES): the
    dataset that pyarrow, DuckDB, Polars, pandas and Spark read in place."""
    import pyarrow.parquet as pq

    target.mkdir()
    # a row per protein: its scores, not its maps (a residue pair's values each)
    scores = [name for name in emb.unlayered if name not in (contacts.NAME, attentions.NAME)]
    schema = parquet_schema(emb, options.kinds, scores)
    writer, written, files = None, 0, 0
    try:
        for block in blocks(emb, options.kinds, scores):
            table = parquet_table(block, schema)
            if writer is None or written >= PARQUET_FILE_BYTES:
                if writer is not None:
                    writer.close()
                writer = pq.ParquetWriter(target / f"part-{files:05d}.parquet", schema)
                written, files = 0, files + 1
            writer.write_table(table)
            written += table.nbytes
            bar.update(len(block.ids))
        if writer is None:  # no protein: the columns alone
            pq.write_table(schema.empty_table(), target / "part-00000.parquet")
    finally:
        if writer is not None:
            writer.close()
