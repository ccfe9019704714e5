"""Reading a run's embeddings.h5: by ID, in batches in input order, a layer as one array,
per-residue rows and contact maps through their offsets, and a torch Dataset (torch is
imported only for that one).

    emb = esmshard.open_embeddings("results/embeddings.h5")
    emb["P0A7Z4"].mean[33]            # one protein: every kind and layer the file holds
    X = emb.array("mean")             # N × D, the highest layer; memory-mapped where possible

A layer is named as stored (0 .. the model's layers) or, as in fair-esm, counted from the end
with negative numbers (-1 is the model's last layer); None is the highest layer stored.
"""

import csv
import io
import json
import os
from pathlib import Path
from typing import Iterator, NamedTuple

import h5py
import numpy as np

from ..compute.provenance import MADE_BY
from ..embeddings_h5 import attentions, contacts
from ..embeddings_h5.id_index import find_row, has_id_index
from ..embeddings_h5.in_place import Parts, PlacedValues, checksum_cache, is_in_place
from ..embeddings_h5.representations import (
    KINDS,
    LAYERED,
    PER_TOK_OFFSETS,
    UNLAYERED,
    absolute_layers,
)
from ..files import DamagedFileError, atomic_path, is_object_url, write_tsv
from ..store import changed_files
from ..store.object_file import object_file
from ..store.shardfile import dataset


class Protein(NamedTuple):
    """One protein's embeddings: {layer: array} per representation kind the file holds."""

    id: str
    sequence_sha256: str
    length: int  # residues embedded (after truncation)
    mean: dict[int, np.ndarray]
    bos: dict[int, np.ndarray]
    per_tok: dict[int, np.ndarray]  # length × D
    contacts: np.ndarray | None  # length × length
    # the scores the file holds, by name (logits, masked_marginals: length × 20; pll: 2)
    scores: dict[str, np.ndarray] = {}
    attentions: np.ndarray | None = None  # layers × heads × length × length (attention_layers)

    def __repr__(self) -> str:
        # what it holds, not its arrays: a notebook shows a protein of 1,000 residues in a line
        layered = (("mean", self.mean), ("bos", self.bos), ("per_tok", self.per_tok))
        held = [at_layers(kind, sorted(values)) for kind, values in layered if values]
        held += list(self.scores)
        held += [name for name in ("contacts", "attentions") if getattr(self, name) is not None]
        residues = f"{self.length:,} residue{'s' if self.length != 1 else ''}"
        return f"<Protein {self.id!r}, {residues}: {', '.join(held) or 'nothing'}>"


def at_layers(kind: str, layers: list[int]) -> str:
    """`mean (layer 33)`, `per_tok (layers 3, 6)`: a kind and its layers, as the reprs say them."""
    return f"{kind} (layer{'s' * (len(layers) > 1)} {', '.join(map(str, layers))})"


class Batch(NamedTuple):
    """Consecutive proteins `start` .. `start + len(ids)` in input order, one layer of one kind
    (per-residue kinds: their rows concatenated, split by `offsets`, which start at 0)."""

    start: int
    ids: list[str]
    values: np.ndarray
    offsets: np.ndarray | None


def read_failed(path, text: str | None = None) -> dict[str, str]:
    """failed_sequences.tsv (its `text`, where it was read already): the reason each record
    could not be embedded, by ID."""
    try:
        with open(path, newline="") if text is None else io.StringIO(text, newline="") as fh:
            return {row["id"]: row["reason"] for row in csv.DictReader(fh, delimiter="\t")}
    except (UnicodeDecodeError, KeyError, csv.Error) as err:
        raise DamagedFileError(
            f"{path} is not the failed_sequences.tsv esmshard writes (id and reason columns: "
            f"{type(err).__name__}); remove it and run the workflow again to rewrite it"
        ) from None


# HDF5's words for a file that is not an HDF5 file whole, in the user's.
_H5_PROBLEMS = {"truncated file": "cut short", "file signature not found": "not an HDF5 file"}


def embeddings_file(source) -> Path:
    """The embeddings.h5 that `source` names: the file, or the outdir that holds it."""
    path = Path(source)
    return path / "embeddings.h5" if path.is_dir() and path.suffix != ".h5" else path


def object_embeddings_url(url: str) -> str:
    """The embeddings.h5 that `url` names in object storage: the object, or the outdir's."""
    return url if url.endswith(".h5") else f"{url.rstrip('/')}/embeddings.h5"


def open_h5(path, source=None) -> h5py.File:
    """An embeddings.h5 esmshard wrote, open for reading; anything else: DamagedFileError.
    `source`: the object at the URL `path`, opened for ranged reads (esmshard.store.object_file)."""

    def damaged(problem: str) -> DamagedFileError:
        redo = "remove it and run the workflow again to write it"
        return DamagedFileError(f"{problem}; {redo}", problem=problem)

    if source is None and path.is_dir():
        raise damaged(f"{path} is a folder, not the embeddings file")
    try:
        h5 = h5py.File(source or path, "r")
    except OSError as err:
        if source is None and (not path.exists() or isinstance(err, PermissionError)):
            raise
        text = str(err)
        said = next((what for words, what in _H5_PROBLEMS.items() if words in text), text)
        raise damaged(f"{path} is not a whole embeddings file ({said})") from None
    if "ids" not in h5:
        h5.close()
        raise damaged(
            f"{path} is an HDF5 file without the ids every embeddings.h5 holds: not a run's output"
        )
    return h5


class Embeddings:
    """An open embeddings.h5 (esmshard.steps.merge writes it); use as a context manager or `close()`.

    `source`: the file, the outdir that holds it, or the file's bytes in a file object
    (esmshard.embed's results); `failed`: the records that could not be embedded, by ID, with
    the reason (by default, those of failed_sequences.tsv beside the file, as the run wrote it).
    """

    def __init__(self, source, failed: dict[str, str] | None = None):
        self.object = None  # an embeddings.h5 in object storage, read by ranged requests
        if hasattr(source, "read"):
            self.path = None
            self.h5 = h5py.File(source, "r")
            self.name = "these embeddings"
        elif is_object_url(source):
            self.path, self.name = None, object_embeddings_url(str(source))
            self.object = object_file(self.name)
            self.h5 = open_h5(self.name, self.object)
        else:
            self.path = embeddings_file(source)
            self.h5 = open_h5(self.path)
            self.name = str(self.path)
        self.failed = failed if failed is not None else self._failed_beside()
        # in place (esmshard.embeddings_h5.in_place): the values are read from the store's parts
        self.parts = None
        if is_in_place(self.h5):
            try:
                where = self.name if self.object else self.path
                self.parts = Parts(self.h5, where, self.name, object_file)
                # Each part's content against its manifest's SHA-256, hashed only where the
                # part's file changed since it was last checked (a checksum cache, which the
                # merge fills): bytes changed where they lie are refused, never read as numbers.
                # (An object's ETag is checked as it is opened: objects change only whole.)
                changed = changed_files(self.parts.local_paths, checksum_cache(self.path))
                if changed:
                    code, what = changed[0]
                    raise DamagedFileError(self.parts.damaged(code, what))
            except Exception:
                self.h5.close()
                raise
        if self.parts:
            self.layers = {}
            for name in self.parts.datasets:
                kind, _, layer = name.partition("/")
                if kind in LAYERED:
                    self.layers.setdefault(kind, []).append(int(layer))
        else:
            self.layers = {
                kind: sorted(int(layer) for layer in self.h5[kind] if layer.isdigit())
                for kind in LAYERED
                if kind in self.h5
            }
        # the unlayered kinds it holds (contact maps, scores)
        placed = self.parts.datasets if self.parts else {}
        self.unlayered = [
            name
            for name, kind in UNLAYERED.items()
            if kind.values in self.h5 or kind.values in placed
        ]
        self.has_contacts = contacts.NAME in self.unlayered
        num_layers = self.h5.attrs.get("num_layers")  # for negative layer numbers
        self.num_layers = int(num_layers) if num_layers is not None and num_layers >= 0 else None
        self._row_of = None

    def _failed_beside(self) -> dict[str, str]:
        """The failures that the run wrote beside its embeddings.h5; none known: {}."""
        if self.object is not None:
            listed = f"{self.name.rsplit('/', 1)[0]}/failed_sequences.tsv"
            try:
                return read_failed(listed, object_file(listed).read().decode())
            except FileNotFoundError:
                return {}
        listed = self.path.parent / "failed_sequences.tsv" if self.path else None
        return read_failed(listed) if listed is not None and listed.is_file() else {}

    @property
    def made_by(self) -> dict:
        """What made these numbers (esmshard.compute.provenance.MADE_BY): the model as given, its
        family and shape, the weights' source and SHA-256 (or random), the settings key,
        esmshard's version and the precision; a file of an earlier version has fewer of them."""
        attrs = self.h5.attrs
        return {
            name: attrs[name].item() if hasattr(attrs[name], "item") else attrs[name]
            for name in MADE_BY
            if name in attrs
        }

    def __repr__(self) -> str:
        where = f" in {self.name}" if self.path or self.object else ""  # embed's: in memory
        if not self.h5:  # closed
            return f"<Embeddings{where}, closed>"
        held = [at_layers(kind, layers) for kind, layers in self.layers.items()]
        model = self.made_by.get("model")
        failed = f"; {len(self.failed)} failed" if self.failed else ""
        proteins = f"{len(self):,} protein{'s' if len(self) != 1 else ''}"
        return (
            f"<Embeddings of {proteins}{f' by {model}' if model else ''}: "
            f"{', '.join(held + self.unlayered)}{failed}{where}>"
        )

    def save(self, folder) -> Path:
        """Write these embeddings into the new folder `folder` as a run's outdir holds them
        (`embeddings.h5`, values in the file, and `failed_sequences.tsv`), for `esmshard
        export` and `open_embeddings`; the folder appears whole once written, and an existing
        one is refused."""
        folder = Path(folder)
        if self.parts is not None:  # the values are in a store's parts, not in this file
            raise ValueError(
                f"{self.name} holds its values in its store: esmshard export --format h5 "
                "writes a copy with them"
            )
        if os.path.lexists(folder):
            raise FileExistsError(f"{folder} exists; remove it or choose another folder")
        with atomic_path(folder, replace=False) as target:
            target.mkdir()
            (target / "embeddings.h5").write_bytes(self.h5.id.get_file_image())
            write_tsv(target / "failed_sequences.tsv", ["id", "source", "reason"],
                      [(id_, "", why) for id_, why in self.failed.items()])  # fmt: skip
        return folder

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self) -> None:
        if self.parts:
            self.parts.close()
        self.h5.close()
        if self.object is not None:
            self.object.close()

    def stored(self, name: str):
        """The dataset `name` as the file holds it, or, in place, read from the store's parts
        (esmshard.embeddings_h5.in_place.PlacedValues: indexed by a row or a slice, the same numbers)."""
        if self.parts and name in self.parts.datasets:
            return PlacedValues(self.parts, name)
        return self.h5[name]

    def __len__(self) -> int:
        return len(self.h5["ids"])

    @property
    def dim(self) -> int:
        kind, layers = next(iter(self.layers.items()))
        return self.stored(dataset(kind, layers[0])).shape[1]

    def ids(self, start: int = 0, stop: int | None = None) -> list[str]:
        return self.h5["ids"].asstr()[start:stop].tolist()

    def row(self, id_: str) -> int:
        """The row of protein `id_`: a few reads of the file's ID index (esmshard.embeddings_h5.id_index);
        in a file written before it, the first lookup reads every ID (~100 bytes each)."""
        if has_id_index(self.h5):
            found = find_row(self.h5, id_) if isinstance(id_, str) else None
        else:
            if self._row_of is None:
                self._row_of = {name: row for row, name in enumerate(self.ids())}
            found = self._row_of.get(id_)
        if found is None:
            raise KeyError(f"{id_!r} is not in {self.name} (failed, or not in the input)")
        return found

    def _row(self, protein: int | str) -> int:
        """A row given as a row, or as an ID."""
        return protein if isinstance(protein, (int, np.integer)) else self.row(protein)

    def __contains__(self, id_: str) -> bool:
        try:
            self.row(id_)
        except KeyError:
            return False
        return True

    def layer(self, kind: str, layer: int | None = None) -> int:
        """The stored layer number that `layer` names (see the module's docstring)."""
        if kind not in self.layers:
            raise KeyError(
                f"{self.name} holds no {kind!r} representations; it holds {self.layers}"
            )
        stored = self.layers[kind]
        if layer is None:
            return stored[-1]
        if layer < 0 and self.num_layers:
            layer += self.num_layers + 1
        if layer not in stored:
            raise KeyError(f"{self.name} holds {kind!r} at layers {stored}, not at {layer}")
        return layer

    def _dataset(self, kind: str, layer: int | None = None) -> str:
        """The dataset of `kind` (at `layer`, for a layered kind)."""
        if kind in LAYERED:
            return dataset(kind, self.layer(kind, layer))
        if kind not in self.unlayered:
            title = KINDS[kind].title if kind in KINDS else repr(kind)
            raise KeyError(f"{self.name} holds no {title} (include: {kind})")
        return KINDS[kind].values

    def _offsets(self, kind: str):
        """The dataset of where each protein's rows of `kind` start; None: a row per protein."""
        offsets = KINDS[kind].offsets
        return self.h5[offsets] if offsets else None

    def array(self, kind: str = "mean", layer: int | None = None) -> np.ndarray:
        """One layer of one kind, every protein (per-residue kinds: every residue, see
        `offsets`): memory-mapped when the dataset is stored whole and uncompressed in a file, as
        esmshard writes it unless per_residue_compression is set; read into memory otherwise."""
        data = self._sliceable(kind, layer)
        return data if isinstance(data, np.memmap) else data[:]

    def _sliceable(self, kind: str, layer: int | None = None):
        """One layer of one kind as an array to slice: memory-mapped where the file stores it
        whole and uncompressed, else the dataset (or the store's parts) read a slice at a time."""
        data = self.stored(self._dataset(kind, layer))
        if isinstance(data, PlacedValues):
            return data
        offset = data.id.get_offset()
        if offset is None or data.compression or data.chunks or self.path is None:
            return data
        return np.memmap(self.path, data.dtype, "r", offset=offset, shape=data.shape)

    def slices(self, kind: str, layer: int | None = None) -> tuple[object, np.ndarray]:
        """A per-residue kind's values of every protein and where each protein's start (its
        offsets, one more than the proteins): protein k's values are `values[offsets[k] :
        offsets[k + 1]]`, read without holding the others (memory-mapped, or a slice of the
        dataset): for reading every protein in turn."""
        offsets = self._offsets(kind)
        if offsets is None:
            raise KeyError(f"{kind!r} holds a row per protein, not slices of residues")
        return self._sliceable(kind, layer), offsets[:]

    @property
    def offsets(self) -> np.ndarray:
        return self.h5[PER_TOK_OFFSETS][:]

    def values(self, protein: int | str, kind: str, layer: int | None = None) -> np.ndarray:
        """One protein's values of one kind, by row or ID: a layered kind's at one layer (its
        vector, or its per-residue rows), an unlayered one's rows (logits: length × 20, in the
        order of esmshard.embeddings_h5.scores.AMINO_ACIDS; pll: its two values)."""
        data, offsets = self.stored(self._dataset(kind, layer)), self._offsets(kind)
        row = self._row(protein)
        if offsets is None:
            return data[row]
        start, stop = offsets[row : row + 2]
        return data[start:stop]

    def per_residue(self, protein: int | str, layer: int | None = None) -> np.ndarray:
        """One protein's per-residue rows (length × D), by row or ID."""
        return self.values(protein, "per_tok", layer)

    @property
    def attention_layers(self) -> list[int]:
        """The layers of the attention maps, as stored (1 to the model's layers)."""
        asked = json.loads(self.h5.attrs["settings"]).get("attention_layers")
        if attentions.NAME not in self.unlayered or asked is None:
            raise KeyError(f"{self.name} holds no attention maps (include: attentions)")
        return absolute_layers(asked, self.num_layers)

    def attention_maps(self, protein: int | str) -> np.ndarray:
        """One protein's attention maps (layers × heads × length × length; heads 1 where
        their mean was kept), by row or ID: `attention_layers` says which layers."""
        row = self._row(protein)
        values = self.values(row, attentions.NAME)
        length = int(self.h5["lengths"][row])
        return attentions.maps(values, length, len(self.attention_layers))

    def contact_map(self, protein: int | str) -> np.ndarray:
        """One protein's contact map (length × length), by row or ID."""
        row = self._row(protein)
        return contacts.full_matrix(self.values(row, contacts.NAME), int(self.h5["lengths"][row]))

    def __getitem__(self, protein: int | str) -> Protein:
        row = self._row(protein)
        if not 0 <= row < len(self):
            raise IndexError(f"row {row} is not in {self.name} ({len(self)} proteins)")
        h5 = self.h5

        def rows(kind):
            return {layer: self.values(row, kind, layer) for layer in self.layers.get(kind, [])}

        return Protein(
            id=h5["ids"].asstr()[row],
            sequence_sha256=h5["sequence_sha256"][row].decode(),
            length=int(h5["lengths"][row]),
            mean=rows("mean"),
            bos=rows("bos"),
            per_tok=rows("per_tok"),
            contacts=self.contact_map(row) if self.has_contacts else None,
            scores={
                kind: self.values(row, kind)
                for kind in self.unlayered
                if kind not in (contacts.NAME, attentions.NAME)
            },
            attentions=self.attention_maps(row) if attentions.NAME in self.unlayered else None,
        )

    def batches(
        self, kind: str = "mean", layer: int | None = None, size: int = 4096
    ) -> Iterator[Batch]:
        """`size` proteins at a time in input order: memory bounded by the batch, not the file."""
        data, offsets = self.stored(self._dataset(kind, layer)), self._offsets(kind)
        for start in range(0, len(self), size):
            stop = min(start + size, len(self))
            if offsets is None:
                yield Batch(start, self.ids(start, stop), data[start:stop], None)
                continue
            bounds = offsets[start : stop + 1]
            yield Batch(
                start, self.ids(start, stop), data[bounds[0] : bounds[-1]], bounds - bounds[0]
            )

    def nearest(
        self, query, k: int = 10, metric: str = "euclidean", layer: int | None = None,
        annotations=None, terms: str | None = None, max_distance: float | None = None,
        ontology=None, index: str = "exact",
    ):  # fmt: skip
        """The `k` proteins nearest to `query` (one of this file's IDs, left out of its own
        answer, or a vector of its width) by their mean embeddings at `layer` (default: the
        last held), nearest first, as (id, distance) pairs; `metric`: euclidean or cosine.
        For many queries at once, `query` is a matrix (a row each) or another open
        embeddings.h5 (this one: each protein's own row left out), and the answer a pandas
        DataFrame: query (the row) or id, rank, neighbour, distance, and the neighbour's
        columns of `annotations` (a CSV or TSV with an `id` column) where given.
        With `terms` (a column of `annotations`), the terms carried instead, as `esmshard
        neighbours --terms` carries them (`max_distance`, `ontology`: its options): a DataFrame
        of id, term, aspect, reliability, hits. `index`: exact, or ivf, hnsw or auto as
        `esmshard neighbours --index` (a faiss index kept beside this file, its recall@k
        measured on a sample of the queries and logged)."""
        from .nearest import nearest_to

        return nearest_to(self, query, k, metric, layer, index, annotations=annotations,
                          terms=terms, max_distance=max_distance, ontology=ontology)  # fmt: skip

    def dataset(self, kind: str = "mean", layer: int | None = None):
        """A torch.utils.data.Dataset of (id, tensor) per protein (esmshard.outputs.torchdata)."""
        from .torchdata import EmbeddingDataset

        source = self.name if self.object else self.path  # its workers open it each
        if source is None:
            raise ValueError(
                "a Dataset reads an embeddings.h5 file: these embeddings are held in memory "
                "(esmshard.embed); use array() or batches(), or a run's embeddings.h5"
            )
        return EmbeddingDataset(source, kind, self.layer(kind, layer), len(self), Embeddings)
