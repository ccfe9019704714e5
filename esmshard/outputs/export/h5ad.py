"""Write an AnnData file (anndata, scanpy) with h5py, in AnnData's on-disk format."""

import json

import h5py
import numpy as np

from ...embeddings_h5.representations import KINDS
from ...store.shardfile import dataset
from .blocks import ExportError, Options, blocks

ANNDATA = {"encoding-type": "anndata", "encoding-version": "0.1.0"}


def _h5ad_group(parent, name: str, kind: str):
    """An AnnData element group: `dict` or `dataframe`."""
    group = parent.create_group(name)
    version = "0.2.0" if kind == "dataframe" else "0.1.0"
    group.attrs.update({"encoding-type": kind, "encoding-version": version})
    return group


def _h5ad_dataset(group, name: str, data=None, shape=None, dtype=None):
    """An AnnData array (`array` or, for text, `string-array`), whole or to be filled."""
    if dtype is None and data is not None and np.asarray(data).dtype.kind in "OUS":
        dtype = h5py.string_dtype("utf-8")
    out = group.create_dataset(name, data=data, shape=shape, dtype=dtype)
    text = h5py.check_string_dtype(out.dtype) is not None
    out.attrs.update({"encoding-type": "string-array" if text else "array",
                      "encoding-version": "0.2.0"})  # fmt: skip
    return out


def write_h5ad(emb, target, bar, options: Options):
    kinds = {k: layers for k, layers in emb.layers.items() if not KINDS[k].per_residue}
    scores = [name for name in emb.unlayered if KINDS[name].offsets is None]  # a row each: pll
    if not kinds and not scores:
        raise ExportError(
            "h5ad holds a row per protein, and this run has no per-protein values (mean, bos, "
            "pll): export its per-residue values as npy, parquet or pt"
        )
    n = len(emb)
    with h5py.File(target, "w") as out:
        out.attrs.update(ANNDATA)
        obs = _h5ad_group(out, "obs", "dataframe")
        columns = ["description", "length", "truncated", "sequence_sha256"]
        obs.attrs.update({"_index": "_index", "column-order": columns})
        index = _h5ad_dataset(obs, "_index", shape=(n,), dtype=h5py.string_dtype("utf-8"))
        # the FASTA header after the ID
        description = _h5ad_dataset(
            obs, "description", shape=(n,), dtype=h5py.string_dtype("utf-8")
        )
        _h5ad_dataset(obs, "length", emb.h5["lengths"][:].astype(np.int64))
        _h5ad_dataset(obs, "truncated", emb.h5["truncated"][:].astype(bool))
        _h5ad_dataset(obs, "sequence_sha256", emb.h5["sequence_sha256"].asstr()[:])
        var = _h5ad_group(out, "var", "dataframe")
        var.attrs.update({"_index": "_index", "column-order": np.array([], dtype=np.float64)})
        _h5ad_dataset(var, "_index", np.array([], dtype=object))
        obsm = _h5ad_group(out, "obsm", "dict")
        targets = {}
        for kind, layers in kinds.items():
            for layer in layers:
                data = emb.stored(dataset(kind, layer))
                targets[(kind, layer)] = _h5ad_dataset(
                    obsm, f"{kind}_{layer}", shape=data.shape, dtype=data.dtype
                )
        for name in scores:
            data = emb.stored(KINDS[name].values)
            targets[name] = _h5ad_dataset(obsm, name, shape=data.shape, dtype=data.dtype)
        for name in ("layers", "obsp", "varm", "varp"):
            _h5ad_group(out, name, "dict")
        uns = _h5ad_group(_h5ad_group(out, "uns", "dict"), "esmshard", "dict")
        for key, value in emb.made_by.items():  # numbers as numbers, else text (or JSON text)
            if isinstance(value, (int, float)):
                uns.create_dataset(key, data=value)
                encoding = "numeric-scalar"
            else:
                text = value if isinstance(value, str) else json.dumps(value)
                uns.create_dataset(key, data=text, dtype=h5py.string_dtype("utf-8"))
                encoding = "string"
            uns[key].attrs.update({"encoding-type": encoding, "encoding-version": "0.2.0"})
        for block in blocks(emb, kinds, scores):
            rows = slice(block.start, block.start + len(block.ids))
            index[rows] = block.ids
            description[rows] = [h[len(i) :].lstrip() for i, h in zip(block.ids, block.headers)]
            for kind, layers in block.values.items():
                for layer, values in layers.items():
                    targets[(kind, layer)][rows] = values
            for name, (values, _) in block.unlayered.items():
                targets[name][rows] = values
            bar.update(len(block.ids))
