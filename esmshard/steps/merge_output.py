"""embeddings.h5 as the merge writes it: the records' IDs, headers and index, then each dataset
of the values in input order (or where they are in the parts) and the file's attributes.
"""

import logging
from typing import TYPE_CHECKING, NamedTuple

import h5py
import numpy as np

from ..compute.telemetry import peak_memory_mb
from ..embeddings_h5.id_index import IdIndexWriter, id_hashes
from ..embeddings_h5.in_place import per_residue, write_placement
from ..embeddings_h5.representations import kind_of
from ..files import atomic_path
from ..input.records import iter_batches
from ..store.shardfile import SHA256_DTYPE, STR_DTYPE
from .merge_rows import PartMembers, Placement, copy_in_input_order

if TYPE_CHECKING:
    from .merge_scan import Scan, Shapes

log = logging.getLogger(__name__)

# Lossless compression of the per-residue datasets (HDF5 filters any HDF5 reader has).
COMPRESSIONS = {"none": None, "gzip": "gzip", "lzf": "lzf"}
CHUNK_BYTES = 1 << 20
STRINGS_AT_ONCE = 1 << 16


class Output(NamedTuple):
    """embeddings.h5 as the merge writes it: at a temporary path, renamed into place whole."""

    path: str
    records: str
    spill_dir: str
    per_residue_compression: str
    in_place: bool
    store: object = None  # esmshard.store.Store: an object store's parts are named by URL

    def write(self, scan: "Scan", shapes: "Shapes", members: PartMembers, attrs: dict) -> None:
        """Write the records' IDs, lengths and offsets, then each dataset of the values (or,
        in place, where they are in the parts) and the file's attributes."""
        n = members.n
        # a copy needs room for the file and its spill files; in place, for the IDs and the rest
        needed = n * 256 + (1 << 20) if self.in_place else 2 * shapes.size() + (1 << 20)
        with atomic_path(self.path, needed_bytes=needed) as tmp, h5py.File(tmp, "w") as out:
            index = IdIndexWriter(self.spill_dir)
            write_text_columns(out, self.records, shapes.embedded, shapes.n_embedded, index.add)
            index.write(out)
            log.info("ids, headers and their index written; peak memory so far %.0f MB",
                     peak_memory_mb())  # fmt: skip
            out.create_dataset("lengths", data=scan.lengths[shapes.embedded])
            for name, values in shapes.starts.items():
                out.create_dataset(name, data=values)
            if self.in_place:
                write_placement_of(out, scan.parts(members), shapes.row_of, shapes.n_embedded,
                                 shapes.values, self.store)  # fmt: skip
                log.info("in place: where each protein's values are in the parts, written")
            else:
                for name, (shape, out_dtype) in shapes.values.items():
                    target = self.create(out, name, shape, out_dtype)
                    placement = Placement(shapes.row_of, shapes.starts.get(kind_of(name).offsets))
                    copy_in_input_order(scan.parts(members), name, target, placement,
                                        self.spill_dir)  # fmt: skip
                    log.info("%s written; peak memory so far %.0f MB", name, peak_memory_mb())
            out.attrs.update(attrs)

    def create(self, out, name, shape, out_dtype):
        """Create dataset `name`: stored whole unless compressed, so that readers can memory-map
        it; a score's columns named (logits: the 20 amino acids)."""
        compression = COMPRESSIONS[self.per_residue_compression] if per_residue(name) else None
        row_items = int(np.prod(shape[1:]))
        target = out.create_dataset(
            name,
            shape,
            dtype=out_dtype,
            chunks=(max(1, min(shape[0], CHUNK_BYTES // (row_items * out_dtype.itemsize))),
                    *shape[1:])
            if shape[0] and compression
            else None,
            compression=compression,
        )  # fmt: skip
        if kind_of(name).columns:
            target.attrs["columns"] = list(kind_of(name).columns)
        return target


def write_text_columns(out, records, embedded, n_embedded, add_hashes) -> None:
    """`ids`, `headers`, `truncated` and `sequence_sha256` of the embedded records, streamed from
    the record table; the IDs' hashes (esmshard.embeddings_h5.id_index) to `add_hashes`, in row order."""
    ids = out.create_dataset("ids", (n_embedded,), dtype=STR_DTYPE)
    headers = out.create_dataset("headers", (n_embedded,), dtype=STR_DTYPE)
    truncated = out.create_dataset("truncated", (n_embedded,), dtype=bool)
    sha256 = out.create_dataset("sequence_sha256", (n_embedded,), dtype=SHA256_DTYPE)
    row = start = 0
    columns = ["id", "description", "truncated", "sequence_sha256"]
    for batch in iter_batches(records, columns, STRINGS_AT_ONCE):
        keep = np.flatnonzero(embedded[start : start + batch.num_rows])
        start += batch.num_rows
        if not keep.size:
            continue
        taken = batch.take(keep)
        batch_ids = taken.column("id").to_pylist()
        described = taken.column("description").to_pylist()
        rows = slice(row, row + keep.size)
        ids[rows] = np.array(batch_ids, dtype=object)
        add_hashes(id_hashes(batch_ids))
        headers[rows] = np.array(
            [
                i + (f" {d}" if d and not d[0].isspace() else d)
                for i, d in zip(batch_ids, described)
            ],
            dtype=object,
        )
        truncated[rows] = taken.column("truncated").to_numpy(zero_copy_only=False)
        sha256[rows] = np.asarray(
            taken.column("sequence_sha256").to_numpy(zero_copy_only=False), dtype=SHA256_DTYPE
        )
        row = rows.stop


def write_placement_of(out, parts, row_of, n_embedded, shapes, store=None) -> None:
    """Where each embedded record's values are: its part (of those that hold any) and row;
    `parts`: PartRows, each part's in a run."""
    part_of = np.empty(n_embedded, dtype=np.int32)
    part_rows = np.empty(n_embedded, dtype=np.uint32)
    paths = []
    for part in parts:
        if not part.rows.size:
            continue
        if not paths or paths[-1] != part.path:
            paths.append(part.path)
        at = row_of[part.records]
        part_of[at], part_rows[at] = len(paths) - 1, part.rows
    write_placement(out, paths, part_of, part_rows, shapes, store)
