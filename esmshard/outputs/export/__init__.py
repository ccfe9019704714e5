"""`esmshard export`: a run's embeddings.h5 in the layouts that other tools read (formats.FORMATS),
read in blocks (blocks), one module per format."""

from .blocks import ExportError
from .formats import FORMATS, Format, export, option_problem
from .pt import header_path, pt_name
from .stop import ProgressBar, Stop, stoppable

__all__ = [
    "FORMATS",
    "ExportError",
    "Format",
    "ProgressBar",
    "Stop",
    "export",
    "header_path",
    "option_problem",
    "pt_name",
    "stoppable",
]
