"""esmshard: sharded, multi-GPU protein language model embeddings (ESM-2, ESM-1b/1v, ESM C,
ProtT5, ProstT5, Ankh, ProtBert; esmshard.models.FAMILIES)."""

from .api import embed, open_embeddings
from .version import __version__

__all__ = ["__version__", "embed", "open_embeddings"]
