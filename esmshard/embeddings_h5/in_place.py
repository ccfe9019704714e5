"""Outputs read in place: an embeddings.h5 whose values stay in the store's parts.

With `output_values: in_place` (or `auto` for a large run), the merge writes everything of
embeddings.h5 but the values of its kinds (representations, contact maps, scores): the IDs,
headers, lengths, the ID index, the kinds' offsets as a copy holds them, and where each protein's values
are: `in_place/part` (its part, a number into `in_place/parts`, the parts' paths, relative to the
file's folder where the store is inside it) and `in_place/row` (its row there). The reader
(esmshard.outputs.reader) reads through them: `PlacedValues` stands for each dataset a copy
would hold, indexed the same way, so that every read gives the numbers of a copy, in its dtype.
The parts must stay where they are, as they were: each part's size is kept too, and a file
whose parts are gone or changed is refused by name rather than read wrong.
"""

import json
import os
from collections import OrderedDict
from pathlib import Path

import h5py
import numpy as np

from ..files import DamagedFileError, is_object_url, user_cache
from ..layout import Layout
from .representations import kind_of, narrowed

LAYOUT = "output_values"  # the file attribute: "copy" or "in_place"
PARTS, PART_BYTES, PART_ETAGS, PART, ROW = (
    "in_place/parts",
    "in_place/part_bytes",
    "in_place/part_etags",
    "in_place/part",
    "in_place/row",
)
# What repairs an in-place output whose parts are gone or changed (the workflow's start finds
# such an output, removes it and its plan, and computes what the store lacks).
REPAIR = (
    "run the same command again: it computes the sequences of the parts gone or changed and "
    "writes embeddings.h5 anew"
)
DATASETS = "in_place_datasets"  # the attribute: {name: [shape, dtype]} of each dataset stood for
OPEN_PARTS = 64  # part files kept open at once
GAP_ROWS = 64  # rows of a part read and dropped rather than a second read started


def is_in_place(h5: h5py.File) -> bool:
    return h5.attrs.get(LAYOUT) == "in_place"


def write_placement(
    out: h5py.File, part_paths, part_of, row_of, datasets: dict, store=None
) -> None:
    """Where each protein's values are: `part_of` (int32, index into `part_paths`) and `row_of`
    (uint32, its row there), in input order; `datasets`: {name: (shape, dtype)} of each dataset
    that a copy would hold. A job's copy of an object store (`store`, esmshard.store.Store)
    names each part by its object's URL, and keeps its ETag: the reader opens it there."""
    folder = Path(out.filename).resolve().parent
    in_bucket = store is not None and store.url is not None
    shown = []
    for path in part_paths:
        if in_bucket:
            shown.append(store.shown(path))
            continue
        path = Path(path).resolve()
        shown.append(str(path.relative_to(folder)) if path.is_relative_to(folder) else str(path))
    out.create_dataset(PARTS, data=np.array(shown, dtype=object), dtype=h5py.string_dtype())
    out.create_dataset(PART_BYTES, data=np.array([os.path.getsize(p) for p in part_paths]))
    if in_bucket:
        etags = [store.etag(path) for path in part_paths]
        out.create_dataset(PART_ETAGS, data=np.array(etags, dtype=object),
                           dtype=h5py.string_dtype())  # fmt: skip
    out.create_dataset(PART, data=part_of)
    out.create_dataset(ROW, data=row_of)
    out.attrs[LAYOUT] = "in_place"
    out.attrs[DATASETS] = json.dumps(
        {name: [list(shape), np.dtype(dtype).name] for name, (shape, dtype) in datasets.items()}
    )


class Parts:
    """The store parts an in-place embeddings.h5 reads, each opened when first read: a file,
    or an object of an object store, which `open_object` opens for ranged reads (the reader
    gives esmshard.store.object_file's)."""

    def __init__(self, h5: h5py.File, path: Path | None, name: str | None = None,
                 open_object=None):  # fmt: skip
        self.h5, self.open_object = h5, open_object
        self.paths = part_paths(h5, path)
        self.name = name or (str(path) if path else "these embeddings")
        self.sizes = h5[PART_BYTES][:]
        self.etags = h5[PART_ETAGS].asstr()[:] if PART_ETAGS in h5 else None
        for code, part in enumerate(self.paths):
            if not is_object_url(part):  # an object's size is checked when it is opened
                self.check_size(code, part.stat().st_size if part.is_file() else None)
        self.datasets = json.loads(h5.attrs[DATASETS])
        self.files = OrderedDict()
        self.starts = {}  # (part, a kind's rows) -> where each row's values start

    @property
    def local_paths(self) -> list[Path]:
        return [part for part in self.paths if not is_object_url(part)]

    def check_size(self, code: int, found: int | None, etag: str | None = None) -> None:
        """Refuse part `code` where it is gone (`found` None) or not as the merge found it."""
        size = self.sizes[code]
        if found == size and (self.etags is None or etag in (None, self.etags[code])):
            return
        if found is None:
            what = "is gone"
        elif found != size:
            what = f"has changed ({found} bytes, not {size})"
        else:
            what = f"has changed (ETag {etag}, not {self.etags[code]})"
        where = "removed, pruned without --keep of this outdir, or the store moved"
        raise DamagedFileError(self.damaged(code, f"{what} ({where})"))

    def file(self, code: int) -> h5py.File:
        if code in self.files:
            self.files.move_to_end(code)
            return self.files[code]
        if len(self.files) == OPEN_PARTS:
            self.files.popitem(last=False)[1].close()
        try:
            self.files[code] = h5py.File(self.opened(code), "r")
        except OSError as err:
            raise DamagedFileError(self.damaged(code, f"it cannot be read ({err})")) from None
        return self.files[code]

    def opened(self, code: int):
        """Part `code`'s path, or its object opened for ranged reads once found as it was."""
        part = self.paths[code]
        if not is_object_url(part):
            return part
        try:
            found = self.open_object(part)
        except FileNotFoundError:
            self.check_size(code, None)
        self.check_size(code, found.size, found.etag)
        return found

    def damaged(self, code: int, what: str) -> str:
        """What to say of part `code`, damaged as `what` says."""
        return (
            f"{self.name} reads its values in place from {len(self.paths)} store "
            f"part{'s' if len(self.paths) != 1 else ''}, and "
            f"{self.paths[code]} {what}: {REPAIR}"
        )

    def row_starts(self, code: int, name: str) -> np.ndarray:
        """Where each row of part `code` starts in its dataset `name` (one row of values per
        protein, per residue, or per contact value), and the end."""
        rows = kind_of(name).rows  # kinds of the same rows: the same starts
        if (code, rows) not in self.starts:
            counts = row_counts(name, self.file(code)["length"][:])
            self.starts[code, rows] = np.concatenate([[0], np.cumsum(counts)])
        return self.starts[code, rows]

    def close(self) -> None:
        for h5 in self.files.values():
            h5.close()
        self.files.clear()


def checksum_cache(embeddings: Path | None) -> Path:
    """The checksum cache of the outdir that holds `embeddings` (Layout.checksums: the merge
    filled it with its parts'), or this user's, where that outdir cannot be written."""
    folder = Path(embeddings).resolve().parent if embeddings else Path.cwd()
    cache = Path(Layout(str(folder)).checksums)
    if os.access(cache.parent if cache.parent.is_dir() else folder, os.W_OK):
        return cache
    return user_cache() / "checksums.json"


def per_residue(name: str) -> bool:
    return kind_of(name).per_residue


def row_counts(name: str, lengths: np.ndarray) -> np.ndarray:
    """The rows of dataset `name` (of a part, or embeddings.h5) that sequences of `lengths`
    residues hold each: one, one per residue, or their contact map's triangle."""
    return kind_of(name).row_counts(lengths)


def part_paths(h5: h5py.File, path) -> list:
    """The parts an in-place embeddings.h5 (`h5`, at `path`, a file or an object's URL; None:
    the current folder) reads, their relative paths taken from the file's folder."""
    if is_object_url(path):  # an embeddings.h5 in object storage: beside it there
        return [
            p if is_object_url(p) else f"{str(path).rsplit('/', 1)[0]}/{p}"
            for p in h5[PARTS].asstr()[:]
        ]
    folder = Path(path).resolve().parent if path else Path.cwd()
    return [p if is_object_url(p) else folder / p for p in h5[PARTS].asstr()[:]]


class PlacedValues:
    """A dataset of an in-place embeddings.h5 (`mean/33`, `per_tok/6`, `contacts/values`, `logits/values`), read
    from the store's parts as a copy would hold it: rows in input order, in the copy's dtype.
    Indexed by a row or a slice of rows."""

    def __init__(self, parts: Parts, name: str):
        shape, dtype = parts.datasets[name]
        self.parts, self.name = parts, name
        self.shape, self.dtype = tuple(shape), np.dtype(dtype)
        self.ndim = len(self.shape)
        offsets = kind_of(name).offsets
        self.offsets = parts.h5[offsets] if offsets else None

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, key):
        if isinstance(key, (int, np.integer)):
            row = int(key) + (len(self) if key < 0 else 0)
            if not 0 <= row < len(self):
                raise IndexError(f"row {key} of {self.name}: it has {len(self)}")
            return self._read(row, row + 1)[0]
        if isinstance(key, slice) and key.step in (None, 1):
            start, stop, _ = key.indices(len(self))
            return self._read(start, max(start, stop))
        raise TypeError(f"{self.name} of an in-place embeddings.h5 is read by a row or a slice")

    def _read(self, start: int, stop: int) -> np.ndarray:
        """Rows `start` .. `stop` as a copy holds them."""
        out = np.empty((stop - start, *self.shape[1:]), dtype=np.float32)
        if stop == start:
            return out.astype(self.dtype)
        h5 = self.parts.h5
        if self.offsets is None:  # a row per protein
            first, last = start, stop
            within = np.zeros(stop - start, dtype=np.int64)
            proteins = np.arange(stop - start)
        else:  # rows per residue or contact value: the proteins they belong to
            first = _search(self.offsets, start, "right") - 1
            last = _search(self.offsets, stop, "left")
            bounds = self.offsets[first : last + 1]
            unit = np.arange(start, stop)
            proteins = np.searchsorted(bounds, unit, "right") - 1
            within = unit - bounds[proteins]
        codes, rows = h5[PART][first:last], h5[ROW][first:last].astype(np.int64)
        for code in np.unique(codes).tolist():
            chosen = np.flatnonzero(codes[proteins] == code)
            source = rows[proteins[chosen]]
            if self.offsets is not None:
                source = self.parts.row_starts(code, self.name)[source] + within[chosen]
            out[chosen] = _read_rows(self.parts.file(code)[self.name], source)
        return narrowed(out, self.dtype, f"{self.name} of {self.parts.name}")


def _search(ascending: h5py.Dataset, value: int, side: str) -> int:
    """np.searchsorted on a dataset, reading a few of its values rather than all of them."""
    low, high = 0, len(ascending)
    while high - low > 4096:
        middle = (low + high) // 2
        below = ascending[middle] < value if side == "left" else ascending[middle] <= value
        low, high = (middle + 1, high) if below else (low, middle)
    return low + int(np.searchsorted(ascending[low:high], value, side))


def _read_rows(data: h5py.Dataset, rows: np.ndarray) -> np.ndarray:
    """`data[rows]` for any rows (unsorted, repeated): each run of rows read once, with the
    few rows between close ones (GAP_ROWS) read and dropped."""
    order = np.argsort(rows, kind="stable")
    ordered = rows[order]
    out = np.empty((rows.size, *data.shape[1:]), dtype=data.dtype)
    breaks = np.flatnonzero(np.diff(ordered) > GAP_ROWS) + 1
    for group in np.split(np.arange(rows.size), breaks):
        low, high = int(ordered[group[0]]), int(ordered[group[-1]]) + 1
        out[order[group]] = data[low:high][ordered[group] - low]
    return out
