"""The model families esmshard runs, in one table (FAMILIES), and what a `model:` value names.

A model's family is read from its weights' own files (a folder's config.json, a checkpoint's
tensor names), never from its name; fair-esm's hub names and `random:<name>` are names from the
families' tables of published shapes. A new family is one module (its forward pass and loading,
see Family), its weight readers, and one row here.

Nothing here imports torch when imported: the Snakefile and the jobs that run no model (shard,
merge, report) read the model without a second spent importing it. `fit_problems` does, once
per version of a model's files (remembered in this user's cache).
"""

import difflib
import hashlib
import re
import warnings
from pathlib import Path
from typing import NamedTuple

from ..embeddings_h5 import attentions, scores
from ..embeddings_h5.representations import absolute_layers
from ..files import user_cache
from ..version import __version__
from . import archs, bert_files, esm2_files, esm2_hf, esmc_weights, t5_files, t5_tokenizer
from .spec import Arch, Family, ModelError, ModelSpec, shape_named
from .weights import (
    CHECKPOINT_SUFFIXES,
    checkpoint_contents,
    folder_weight_files,
    hf_snapshot,
    read_config,
    safetensors_files,
    shapes_only,
)

ESM2 = Family(
    name="esm2",
    title="ESM-2",
    module="esmshard.models.esm2",
    archs=archs.ESM2,
    max_residues=1022,
    contacts=True,
    scores=True,
    fp8=True,
)
ESM1 = Family(
    name="esm1",
    title="ESM-1b/1v",
    module="esmshard.models.esm1",
    archs=archs.ESM1,
    max_residues=1022,  # 1,024 learned positions, BOS and EOS among them
    contacts=True,  # ESM-1b's; ESM-1v's checkpoints have no contact regression (contact_problems)
    scores=True,
    fp8=True,
)
ESMC = Family(
    name="esmc",
    title="ESM C",
    module="esmshard.models.esmc",
    archs=archs.ESMC,
    max_residues=2048,
    contacts=False,
    scores=True,
    fp8=True,
)
T5 = Family(
    name="t5",
    title="T5 encoder",
    module="esmshard.models.t5",
    archs={},  # a T5 needs its tokenizer's files: no random:<name> (t5_files.SHAPES lists them)
    max_residues=4096,  # esmshard's default limit: relative positions have no end
    contacts=False,
    bos=False,
    positions_end=False,
    members="ProtT5, ProstT5, Ankh",
)
BERT = Family(
    name="bert",
    title="BERT encoder",
    module="esmshard.models.bert",
    archs={},  # a BERT needs its vocab.txt: no random:<name> (bert_files.SHAPES lists them)
    max_residues=4096,  # esmshard's default limit: its 40,000 positions end far beyond
    contacts=False,
    positions_end=False,
    members="ProtBert, ProtBert-BFD",
)
FAMILIES = {family.name: family for family in (ESM2, ESM1, ESMC, T5, BERT)}


def families_named() -> str:
    """Every family esmshard runs, as `--help` and the errors list them."""
    return ", ".join(family.named for family in FAMILIES.values())


# The families whose published models fair-esm's hub serves by name (their checkpoints' files).
FAIR_ESM = (ESM2, ESM1)

RANDOM_PREFIX = "random:"
HF_PREFIX = "hf:"
HF_REPO = re.compile(r"[\w.-]+/[\w.-]+")


class Weights(NamedTuple):
    """Weights found on disk: their family, shape, what the family's loader reads (a folder or a
    file), and the files that say which weights they are (esmshard.models.spec.ModelSpec.identity)."""

    family: Family
    arch: Arch
    location: Path
    files: tuple[Path, ...]
    params: int | None = None  # its layers' parameters, where not 12·layers·D²


def _found(folder: Path, config: dict | None) -> str:
    if config is not None:
        return f"a config.json of model_type {config.get('model_type')!r}"
    names = sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())
    return (
        "files " + ", ".join(names[:6]) + (" …" if len(names) > 6 else "") if names else "nothing"
    )


def recognise(path: Path) -> Weights:
    """The family and shape of the weights in a folder or a checkpoint file, from their contents;
    ModelError naming what was found where no family's weights are."""
    known = families_named()
    if path.is_dir():
        config = read_config(path)
        if config is not None and config.get("model_type") == "esm":
            arch = esm2_hf.arch_of(esm2_hf.checked_config(path))
            return Weights(ESM2, arch, path, (path / "config.json", *safetensors_files(path)))
        if esmc_weights.is_hf_config(config):
            shape = esmc_weights.hf_shape(path)
            files = (path / "config.json", *safetensors_files(path))
            return Weights(ESMC, shape.arch, path, files, shape.params)
        if t5_files.is_hf_config(config):
            shape = t5_files.shape_of(path)
            # its tokens, checked before any job
            t5_tokenizer.alphabet(path, shape.variant).check_fits(
                t5_files.tokenizer_file(path), shape.vocab
            )
            files = (t5_files.tokenizer_file(path), *folder_weight_files(path))
            return Weights(T5, shape.arch, path, (path / "config.json", *files), shape.params)
        if bert_files.is_hf_config(config):
            shape = bert_files.shape_of(path)
            # its tokens, checked before any job
            bert_files.alphabet(path).check_fits(bert_files.vocabulary_file(path), shape.vocab)
            if shape.positions - 2 < BERT.max_residues:
                raise ModelError(
                    f"{path / 'config.json'}: max_position_embeddings is {shape.positions}, "
                    f"fewer than the {BERT.max_residues} residues (and [CLS], [SEP]) esmshard "
                    "gives a BERT; ProtBert has 40000"
                )
            files = (bert_files.vocabulary_file(path), *folder_weight_files(path))
            return Weights(BERT, shape.arch, path, (path / "config.json", *files), shape.params)
        checkpoints = [p for p in sorted(path.rglob("*")) if p.suffix in CHECKPOINT_SUFFIXES]
        if config is None and len(checkpoints) == 1:
            return recognise(checkpoints[0])._replace(files=(checkpoints[0],))
        raise ModelError(
            f"model folder '{path}' holds no model of a family esmshard knows ({known}): found "
            f"{_found(path, config)}. A folder is one saved by transformers (config.json of "
            "model_type esm, esmc, t5 or bert, and its weights), or holds one EvolutionaryScale .pth"
        )
    contents = checkpoint_contents(path)
    if esm2_files.is_checkpoint(contents):
        return Weights(ESM2, esm2_files.arch_of(path, contents), path, (path,))
    if esm2_files.is_esm1_checkpoint(contents):
        return Weights(ESM1, esm2_files.esm1_arch_of(path, contents), path, (path,))
    if isinstance(contents, dict) and esmc_weights.is_pth(contents):
        shape = esmc_weights.pth_shape(path, contents)
        return Weights(ESMC, shape.arch, path, (path,), shape.params)
    names = sorted(contents) if isinstance(contents, dict) else [type(contents).__name__]
    raise ModelError(
        f"model checkpoint '{path}' holds no model of a family esmshard knows ({known}): found "
        f"{len(names)} entries, {', '.join(map(str, names[:4]))}{' …' if len(names) > 4 else ''}. "
        "esmshard reads fair-esm's ESM-2 and ESM-1b/1v .pt files and EvolutionaryScale's ESM C "
        ".pth files"
    )


def parse_spec(model: str) -> ModelSpec:
    """What `model` names; hf:<owner>/<name> is fetched into the HuggingFace cache if it is not
    there, as its files say its family."""
    if model.startswith(RANDOM_PREFIX):
        name = model[len(RANDOM_PREFIX) :]
        for family in FAMILIES.values():
            if name in family.archs:
                arch = family.archs[name]
                params = esmc_weights.published_params(arch) if family is ESMC else None
                return ModelSpec(family, name, "random", arch=arch, layer_params=params)
        names = [n for family in FAMILIES.values() for n in family.archs]
        raise ModelError(f"model '{model}': unknown architecture; use one of {names}")
    if model.startswith(HF_PREFIX):
        repo = model[len(HF_PREFIX) :]
        if not HF_REPO.fullmatch(repo):
            raise ModelError(
                f"model '{model}': a HuggingFace model is hf:<owner>/<name>, e.g. "
                "hf:facebook/esm2_t33_650M_UR50D"
            )
        snapshot = hf_snapshot(repo)
        found = recognise(snapshot)
        return ModelSpec(
            found.family,
            repo.split("/")[1],
            "hf",
            found.location,
            found.arch,
            repo,
            snapshot.name,
            found.files,
            found.params,
        )
    path = Path(model)
    if path.is_dir():
        found = recognise(path)
        kind = "folder" if found.location == path else "local"
        return ModelSpec(
            found.family,
            path.resolve().name,
            kind,
            found.location,
            found.arch,
            files=found.files,
            layer_params=found.params,
        )
    if path.suffix in CHECKPOINT_SUFFIXES or path.is_file():
        if not path.is_file():
            raise ModelError(f"model checkpoint '{path}' does not exist")
        found = recognise(path)
        return ModelSpec(
            found.family, path.stem, "local", path, found.arch, layer_params=found.params
        )
    for family in FAIR_ESM:
        if model in family.archs:
            return ModelSpec(family, model, "hub", arch=family.archs[model])
    names = sorted(name for family in FAIR_ESM for name in family.archs)
    close = difflib.get_close_matches(model, names, n=1)
    if close:
        raise ModelError(
            f"model '{model}': not a model name esmshard knows; did you mean {close[0]}? "
            "(esmshard run --help lists every way to name a model)"
        )
    raise ModelError(
        f"model '{model}': not a model name esmshard knows. It runs {families_named()}: by "
        f"fair-esm's names ({', '.join(names)}), as hf:<owner>/<name> (HuggingFace, e.g. "
        "hf:biohub/ESMC-6B, hf:Rostlab/prot_t5_xl_uniref50, hf:Rostlab/prot_bert), from a folder "
        "saved by transformers or holding an ESM C .pth, from a local .pt or .pth checkpoint, "
        "or as random:<name>"
    )


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


def ensure_available(spec: ModelSpec) -> None:
    """Fetch what the model needs before the embed jobs start (fair-esm's hub weights)."""
    if spec.family in FAIR_ESM:
        esm2_files.ensure_available(spec)


def load(spec: ModelSpec):
    """(model in eval mode on the CPU, its alphabet); the model, or FastESM2 over it, is a
    forward pass as esmshard.models.spec.Family describes it."""
    return spec.family.runner().load(spec)
