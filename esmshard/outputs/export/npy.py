"""Write a folder of `.npy` arrays that numpy maps without loading them."""

import json

import numpy as np

from ...embeddings_h5.representations import KINDS, PER_TOK_OFFSETS
from ...input.fasta import printable
from ...store.shardfile import dataset
from .blocks import BLOCK_BYTES, ExportError, Options, blocks


class NpyWriter:
    """A .npy file written front to back, a block at a time: no memory map, whose written pages
    would count as the process's memory until the kernel writes them out."""

    def __init__(self, path, dtype, shape):
        from numpy.lib import format as npy

        self.path, self.fh = path, open(path, "wb")
        self.left = int(np.prod(shape)) * np.dtype(dtype).itemsize
        header = {"descr": npy.dtype_to_descr(np.dtype(dtype)), "fortran_order": False}
        npy.write_array_header_1_0(self.fh, {**header, "shape": tuple(shape)})

    def write(self, values: np.ndarray) -> None:
        data = np.ascontiguousarray(values).tobytes()
        self.left -= len(data)
        self.fh.write(data)

    def close(self) -> None:
        self.fh.close()
        if self.left:
            raise ExportError(f"{self.path}: {self.left} bytes short (embeddings.h5 changed?)")


def write_npy(emb, target, bar, options: Options):
    target.mkdir()
    (target / "made_by.json").write_text(json.dumps(emb.made_by, indent=1) + "\n")
    h5 = emb.h5
    files = {}  # (kind, layer) or an unlayered kind -> NpyWriter, filled in the order of the rows
    for kind, layers in options.kinds.items():
        for layer in layers:
            data = emb.stored(dataset(kind, layer))
            files[(kind, layer)] = NpyWriter(
                target / f"{kind}_{layer}.npy", data.dtype, data.shape
            )
    if any(KINDS[kind].per_residue for kind in options.kinds):
        _copy_whole(h5[PER_TOK_OFFSETS], target / "per_tok_offsets.npy")
    for name in emb.unlayered:
        kind = KINDS[name]
        values = emb.stored(kind.values)
        files[name] = NpyWriter(target / f"{name}.npy", values.dtype, values.shape)
        if kind.offsets:
            _copy_whole(h5[kind.offsets], target / f"{name}_offsets.npy")
    with open(target / "ids.tsv", "w", encoding="utf-8") as ids:
        ids.write("id\tsequence_sha256\n")
        for block in blocks(emb, options.kinds, emb.unlayered):
            for kind, layers in block.values.items():
                for layer, values in layers.items():
                    files[(kind, layer)].write(values)
            for name, (values, _) in block.unlayered.items():
                files[name].write(values)
            ids.writelines(f"{printable(i)}\t{s}\n" for i, s in zip(block.ids, block.sha256))
            bar.update(len(block.ids))
    for file in files.values():
        file.close()


def _copy_whole(data, path) -> None:
    """A one-dimensional dataset into a .npy file, a block at a time."""
    out = NpyWriter(path, data.dtype, data.shape)
    step = BLOCK_BYTES // data.dtype.itemsize
    for start in range(0, data.shape[0], step):
        out.write(data[start : start + step])
    out.close()
