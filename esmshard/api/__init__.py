"""esmshard's Python API, re-exported by the package: `esmshard.embed` and
`esmshard.open_embeddings` (calls), and the in-process run behind `embed` (in_process)."""

from .calls import embed, open_embeddings

__all__ = ["embed", "open_embeddings"]
