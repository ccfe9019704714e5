"""Nearest neighbours of embeddings, and what their annotations carry over."""

from .annotations import AnnotationsError, read_annotations
from .exact import METRICS, Hits, merged, nearest, top_k
from .reliability import reliability_index

__all__ = [
    "METRICS",
    "AnnotationsError",
    "Hits",
    "merged",
    "nearest",
    "read_annotations",
    "reliability_index",
    "top_k",
]
