"""esmshard: sharded, multi-GPU protein language model embeddings (ESM-2, ESM C)."""

from .version import __version__


def open_embeddings(path):
    """A run's embeddings.h5 (or the outdir that holds it), open for reading: esmshard.outputs.reader."""
    from .outputs.reader import Embeddings

    return Embeddings(path)


def embed(sequences, model="esm2_t33_650M_UR50D", **settings):
    """Embeddings of `sequences` in this process, read like `open_embeddings`:
    esmshard.commands.inprocess."""
    from .commands.inprocess import embed

    return embed(sequences, model, **settings)


__all__ = ["__version__", "embed", "open_embeddings"]
