"""The model families esmshard runs (families.FAMILIES), what a `model:` value names (naming),
and why a model cannot run as a config asks (checks).

Nothing here imports torch when imported: the Snakefile and the jobs that run no model (shard,
merge, report) read the model without a second spent importing it.
"""

from .checks import (
    attention_problems,
    attention_values,
    checked_marker,
    contact_problems,
    file_problems,
    fit_problems,
    has_lm_head,
    length_problems,
    score_problems,
)
from .families import (
    BERT,
    ESM1,
    ESM2,
    ESMC,
    FAIR_ESM,
    FAMILIES,
    T5,
    ensure_available,
    families_named,
    load,
)
from .naming import parse_spec, recognise
from .spec import ModelError, ModelSpec

__all__ = [
    "BERT",
    "ESM1",
    "ESM2",
    "ESMC",
    "FAIR_ESM",
    "FAMILIES",
    "T5",
    "ModelError",
    "ModelSpec",
    "attention_problems",
    "attention_values",
    "checked_marker",
    "contact_problems",
    "ensure_available",
    "families_named",
    "file_problems",
    "fit_problems",
    "has_lm_head",
    "length_problems",
    "load",
    "parse_spec",
    "recognise",
    "score_problems",
]
