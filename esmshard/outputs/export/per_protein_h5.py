"""Write the per-protein HDF5 files that biotrainer and bio_embeddings read, and biotrainer's
folder.
"""

import h5py

from ...embeddings_h5.representations import KINDS
from ...input.fasta import printable
from .blocks import (
    ExportError,
    Options,
    biotrainer_hash,
    blocks,
    sequences_in_order,
    warn_truncated,
)


def per_protein_file(path) -> h5py.File:
    """An HDF5 file of a dataset per protein. HDF5's newer group format: its original one slows
    to a crawl past ~800,000 datasets in a group; any HDF5 1.10 or later (h5py 2.9 or later)
    reads this one."""
    return h5py.File(path, "w", libver=("v110", "latest"))


def put_protein(out, name: str, values, id_: str) -> None:
    """One protein's values as dataset `name`, gzip-compressed as biotrainer writes them, with
    its record's ID in `original_id`."""
    out.create_dataset(name, data=values, compression="gzip", chunks=True)
    out[name].attrs["original_id"] = id_


BIOTRAINER_FILES = {"mean": "embeddings_per_protein.h5", "per_tok": "embeddings_per_residue.h5"}


def write_biotrainer(emb, target, bar, options: Options):
    target.mkdir()
    sequences = sequences_in_order(emb, options.records, options.workdir)
    files = {kind: per_protein_file(target / name)
             for kind, name in BIOTRAINER_FILES.items() if kind in options.kinds}  # fmt: skip
    try:
        with open(target / "sequences.fasta", "w", encoding="utf-8") as fasta:
            for block in blocks(emb, options.kinds):
                for i, (id_, header) in enumerate(zip(block.ids, block.headers)):
                    sequence = next(sequences)
                    fasta.write(f">{header}\n{sequence.decode('ascii')}\n")
                    name = biotrainer_hash(sequence)
                    for kind, out in files.items():
                        if name not in out:  # a sequence seen before: the same values
                            ((layer, data),) = block.rows(kind, i).items()
                            put_protein(out, name, data, id_)
                bar.update(len(block.ids))
    finally:
        for out in files.values():
            out.attrs.update(emb.made_by)
            out.close()
    if "per_tok" in files:
        warn_truncated(emb, bar, "embeddings_per_residue.h5")


def write_per_protein_h5(emb, target, bar, options: Options):
    ((kind, (layer,)),) = options.kinds.items()
    key = options.key
    sequences = (
        sequences_in_order(emb, options.records, options.workdir) if key == "hash" else None
    )
    with per_protein_file(target) as out:
        for block in blocks(emb, options.kinds):
            for i, id_ in enumerate(block.ids):
                if key == "hash":
                    name = biotrainer_hash(next(sequences))
                    if name in out:
                        continue  # the same sequence: the same values
                else:
                    if "/" in id_ or id_ in (".", ".."):
                        raise ExportError(
                            f"ID '{printable(id_)}' cannot be an HDF5 dataset name ('/' separates groups); "
                            "key the datasets by sequence hash (--key hash)"
                        )
                    name = id_
                put_protein(out, name, block.rows(kind, i)[layer], id_)
            bar.update(len(block.ids))
        out.attrs.update(emb.made_by)
    if KINDS[kind].per_residue:
        warn_truncated(emb, bar, "the export")
