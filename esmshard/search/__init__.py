"""Nearest neighbours of embeddings, and what their annotations carry over."""

from .exact import METRICS, Hits, merged, nearest, top_k
from .reliability import reliability_index

__all__ = ["METRICS", "Hits", "merged", "nearest", "reliability_index", "top_k"]
