"""What a `model:` value names: fair-esm's hub names, `random:<name>`, `hf:<owner>/<name>`, a
folder or a checkpoint file.

A model's family is read from its weights' own files (a folder's config.json, a checkpoint's
tensor names), never from its name; fair-esm's hub names and `random:<name>` are names from the
families' tables of published shapes.
"""

import difflib
import re
from pathlib import Path
from typing import NamedTuple

from . import bert_files, esm2_files, esm2_hf, esmc_weights, t5_files, t5_tokenizer
from .families import BERT, ESM1, ESM2, ESMC, FAIR_ESM, FAMILIES, T5, families_named
from .spec import Arch, Family, ModelError, ModelSpec
from .weights import (
    CHECKPOINT_SUFFIXES,
    checkpoint_contents,
    folder_weight_files,
    hf_snapshot,
    read_config,
    safetensors_files,
)

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
