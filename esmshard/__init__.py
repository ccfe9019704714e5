"""esmshard: sharded, multi-GPU protein language model embeddings (ESM-2, ESM-1b/1v, ESM C,
ProtT5, ProstT5, Ankh, ProtBert; esmshard.models.FAMILIES)."""

from .version import __version__


def open_embeddings(path):
    """A run's embeddings.h5 (or the outdir that holds it), open for reading: esmshard.outputs.reader."""
    from .outputs.reader import Embeddings

    return Embeddings(path)


def __getattr__(name):
    """`esmshard.embed` (esmshard.commands.inprocess), imported when first used: `import esmshard`
    stays quick, and help() and autocompletion see its whole signature."""
    if name == "embed":
        from .commands.inprocess import embed

        return embed
    raise AttributeError(f"module 'esmshard' has no attribute {name!r}")


__all__ = ["__version__", "embed", "open_embeddings"]
