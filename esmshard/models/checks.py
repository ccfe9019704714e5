"""Why a model cannot run as a config asks: its files, their fit, its heads, its positions.

Nothing here imports torch when imported; `fit_problems` does, once per version of a model's
files (remembered in this user's cache).
"""

import hashlib
import re
import warnings
from pathlib import Path

from ..embeddings_h5 import attentions, scores
from ..embeddings_h5.representations import absolute_layers
from ..files import user_cache
from ..version import __version__
from . import bert_files, esm2_files, esm2_hf, esmc_weights
from .families import BERT, ESMC, FAIR_ESM, load
from .spec import ModelError, ModelSpec, shape_named
from .weights import shapes_only


def file_problems(spec: ModelSpec) -> list[str]:
    """Why the model's files cannot be loaded as they lie, found without reading them."""
    return esm2_files.file_problems(spec) if spec.family in FAIR_ESM else []


# torch's words for a tensor whose shape is not the model's (load_state_dict)
SIZE_MISMATCH = re.compile(
    r"size mismatch for (?P<name>\S+): copying a param with shape torch\.Size\((?P<found>\[[^]]*\])\) "
    r"from checkpoint, the shape in current model is torch\.Size\((?P<wanted>\[[^]]*\])\)"
)


def fit_problems(spec: ModelSpec) -> list[str]:
    """Why the model's files cannot be loaded: tensors missing, or of other shapes than its
    config says; found before any job by the family's own loader, run on the files' headers
    alone (esmshard.models.weights.shapes_only: no weight is read). Random weights and fair-esm's
    hub names are not read here."""
    if spec.kind in ("random", "hub"):
        return []
    checked = checked_marker(spec)
    if checked.exists():  # these files, as they are now, were found to fit
        return []
    try:
        # fair-esm warns of ESM-1v's missing contact regression: said where it matters
        with shapes_only(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            load(spec)
    except ModelError as err:
        return [str(err)]
    except (RuntimeError, ValueError, IndexError, AssertionError) as err:  # torch's, fair-esm's
        where = spec.path or spec.name
        shape = shape_named(spec.family.title, spec.arch)
        found = SIZE_MISMATCH.search(str(err))
        if found:
            return [
                f"{where}: tensor {found['name']} is {found['found']} in the weights, where the "
                f"{shape} that its config says has {found['wanted']}: the config and the weights "
                "disagree (is one of them another model's?)"
            ]
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        return [
            f"{where}: the weights cannot be loaded as the {shape} that its config says ({reason})"
        ]
    try:
        checked.parent.mkdir(parents=True, exist_ok=True)
        checked.touch()
    except OSError:
        pass  # checked again next time
    return []


def checked_marker(spec: ModelSpec) -> Path:
    """Where this user's cache marks the model's files, as they are now (each file's path, size
    and modification time), as found to fit (`fit_problems`): the check imports torch, a second
    or two, once per version of the files."""
    path = Path(spec.path)
    files = sorted(path.iterdir()) if path.is_dir() else [path, esm2_files.regression_path(path)]
    seen = [
        (str(f.resolve()), f.stat().st_size, f.stat().st_mtime_ns) for f in files if f.is_file()
    ]
    key = hashlib.sha256(repr((__version__, spec.family.name, seen)).encode()).hexdigest()
    return user_cache() / "weights-fit" / key[:32]


def contact_problems(spec: ModelSpec) -> list[str]:
    """Why a model of a family with a contact head computes no contact maps (`include:
    contacts`): a fair-esm checkpoint without its contact-regression weights (ESM-1v's)."""
    if spec.family not in FAIR_ESM:
        return []
    if spec.kind == "local":  # by its files, whatever it is called
        regression = esm2_files.regression_path(spec.path)
        if regression.is_file():
            return []
        where = f" ({regression} is not beside it)"
    elif esm2_files.has_regression(spec.name):
        return []
    else:
        where = ""
    return [
        f"include: contacts: {spec.name} has no contact-regression weights{where} (ESM-1v's "
        "checkpoints have none), so no contact maps; remove contacts from include, or use "
        "ESM-1b or ESM-2"
    ]


def score_problems(spec: ModelSpec, include, asked_by: str = "include") -> list[str]:
    """Why the model computes none of the language-model scores in `include`: no head (its
    family's, or its files lack it). `asked_by` is the setting that asks for them (`variant_scoring`: the scores it reads)."""
    asked = [kind for kind in include if kind in scores.NEEDS_HEAD]
    if not asked:
        return []
    named = f"{asked_by}: {', '.join(asked)}"
    if asked_by != "include":
        named += " (the scores it reads)"
    if not spec.family.scores:
        remedy = "Remove them from include" if asked_by == "include" else "Leave out variants"
        return [
            f"{named}: {spec.family.title} ({spec.name}) has no language-model head "
            "that esmshard runs; scores come from ESM-2, ESM-1b/1v and ESM C models. "
            f"{remedy}, or use one"
        ]
    problems = []
    if spec.kind != "random" and not has_lm_head(spec):
        saved = "EsmcForMaskedLM's" if spec.family is ESMC else "EsmForMaskedLM's"
        problems.append(
            f"{named}: {spec.path} holds no language-model head (transformers' "
            f"EsmModel and EsmcModel leave it out); use {saved} files, or the model's own "
            "checkpoint"
        )
    return problems


def attention_problems(spec: ModelSpec, config: dict) -> list[str]:
    """Why the model keeps no attention maps as `config` asks (`include: attentions`): a
    family whose maps fair-esm's forward pass does not give, layers it lacks, windows."""
    if attentions.NAME not in config["include"]:
        return []
    if spec.family not in FAIR_ESM:
        return [
            f"include: attentions: {spec.family.title} ({spec.name}): attention maps come from "
            "fair-esm's own forward pass, of ESM-2 and ESM-1b/1v models; remove attentions "
            "from include, or use one"
        ]
    problems = []
    if spec.num_layers:
        problems += attentions.layer_problems(
            config["attention_layers"], spec.num_layers, spec.name
        )
    if config["long_sequences"] == "chunk":
        problems.append(
            "include: attentions cannot be combined with long_sequences: chunk (a map spans the "
            "whole sequence, a window sees part of it); use long_sequences: truncate or skip"
        )
    return problems


def attention_values(spec: ModelSpec, config: dict) -> tuple[int, int]:
    """With `include: attentions`, the values kept per pair of residues and the bytes of one in
    embeddings.h5 (`contacts_dtype`); else (0, 0)."""
    if attentions.NAME not in config["include"]:
        return (0, 0)
    layers = absolute_layers(config["attention_layers"], spec.num_layers)
    width = attentions.Asked(layers, config["attention_heads"]).width(spec.arch.heads)
    return width, 2 if config["contacts_dtype"] == "float16" else 4


def has_lm_head(spec: ModelSpec) -> bool:
    """Whether the model's files hold its language-model head (fair-esm's checkpoints do)."""
    if spec.family is ESMC:
        return esmc_weights.has_lm_head(spec.path)
    if spec.kind in ("hf", "folder"):
        return esm2_hf.has_lm_head(spec.path)
    return True


def length_problems(spec: ModelSpec, limit) -> list[str]:
    """Why `truncation_seq_length` `limit` is beyond the model's own positions, where they end
    beyond its family's default limit (a BERT's: its config's max_position_embeddings)."""
    if spec.family is not BERT or limit == "auto":
        return []
    residues = bert_files.shape_of(spec.path).positions - 2  # [CLS] and [SEP] take two
    if limit <= residues:
        return []
    return [
        f"truncation_seq_length {limit} is beyond the {residues} residues that {spec.name}'s "
        f"positions reach (max_position_embeddings, [CLS] and [SEP] among them); use at most "
        f"{residues}, or auto, and long_sequences: chunk for longer sequences"
    ]
