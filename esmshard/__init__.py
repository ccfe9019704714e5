"""esmshard: sharded, multi-GPU protein language model embeddings (ESM-2, ESM C)."""

from .version import __version__


def open_embeddings(path):
    """A run's embeddings.h5 (or the outdir that holds it), open for reading: esmshard.outputs.reader."""
    from .outputs.reader import Embeddings

    return Embeddings(path)


__all__ = ["__version__", "open_embeddings"]
