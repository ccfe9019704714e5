"""embeddings.h5 as a torch Dataset (apart from esmshard.outputs.reader, which does not import torch)."""

import os

import numpy as np
import torch


class EmbeddingDataset(torch.utils.data.Dataset):
    """(id, tensor) per protein for a torch DataLoader: a per-protein vector, or the per-residue
    rows. Each worker process opens the file itself (an HDF5 handle does not survive a fork),
    with `opener` (esmshard.outputs.reader.Embeddings, which makes these: Embeddings.dataset)."""

    def __init__(self, path, kind: str, layer: int, length: int, opener):
        self.path, self.kind, self.layer, self.length = path, kind, layer, length
        self.opener = opener
        self._opened = None  # (process id, the opened file)

    def _embeddings(self):
        if self._opened is None or self._opened[0] != os.getpid():
            self._opened = (os.getpid(), self.opener(self.path))
        return self._opened[1]

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int):
        emb = self._embeddings()
        values = emb.values(index, self.kind, self.layer)
        return emb.h5["ids"].asstr()[index], torch.from_numpy(np.asarray(values))

    def __getstate__(self):
        return {**self.__dict__, "_opened": None}
