"""Write embeddings.h5 with every value in the file: the portable copy of an in-place run."""

from pathlib import Path

import h5py

from ...embeddings_h5 import in_place
from ...embeddings_h5.representations import KINDS, PER_TOK_OFFSETS, UNLAYERED
from ...store.shardfile import dataset
from .blocks import Options, blocks

# What a copy of embeddings.h5 takes over as it is: everything but the values.
H5_AS_IS = ("ids", "headers", "lengths", "truncated", "sequence_sha256", "id_index",
            PER_TOK_OFFSETS, *(kind.offsets for kind in UNLAYERED.values() if kind.offsets))  # fmt: skip


def write_h5(emb, target, bar, options: Options):
    """embeddings.h5 with its values in the file, as `output_values: copy` writes it, from a
    copy or from one whose values are in place in the store: a file that needs no store."""
    with h5py.File(target, "w") as out:
        for name in H5_AS_IS:
            if name in emb.h5:
                out.require_group(str(Path(name).parent))
                emb.h5.copy(emb.h5[name], out, name=name)
        names = [
            dataset(kind, layer) for kind, layers in options.kinds.items() for layer in layers
        ]
        names += [KINDS[name].values for name in emb.unlayered]
        written = {}
        for name in names:
            values = emb.stored(name)
            out.create_dataset(name, values.shape, values.dtype)
            written[name] = 0
        for block in blocks(emb, options.kinds, emb.unlayered):
            parts = [
                (dataset(k, layer), v) for k, ls in block.values.items() for layer, v in ls.items()
            ]
            parts += [(KINDS[k].values, v) for k, (v, _) in block.unlayered.items()]
            for name, values in parts:
                out[name][written[name] : written[name] + len(values)] = values
                written[name] += len(values)
            bar.update(len(block.ids))
        out.attrs.update({k: v for k, v in emb.h5.attrs.items() if k != in_place.DATASETS})
        out.attrs.update(output_values="copy", per_residue_compression="none")
