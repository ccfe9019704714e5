"""The config as users type it, on the command line or in YAML files, with one meaning.

Snakemake reads a `--config` value that is not a plain number or boolean with YAML's base loader,
so `gpus=[0,1]` arrives as ['0', '1'] and `repr_layers=-1` as -1 where a list is expected. Each
value is turned into what the schema asks for where its text means exactly that; anything else is
left as it was, for the schema's validation to refuse with the key's name.
"""

import os
import re

import jsonschema

# Settings that change the embeddings' numbers, plus `family` and `checkpoint` (which weights
# exactly):
# a change re-runs the embed jobs (Snakemake's params trigger), and merge refuses a shard file
# computed with other values. `gpus` and `toks_per_batch` are not among them, so that moving to
# other GPUs or another batch size never invalidates finished shards.
EMBEDDING_KEYS = (
    "model",
    "repr_layers",
    "include",
    "truncation_seq_length",
    "long_sequences",
    "precision",
    "fast_path",
)

# Bumped by any change of esmshard that changes the numbers computed with the same settings: it is
# part of the settings (and so of the store key), which re-runs the embed jobs and keeps the
# store's older entries apart. Nothing else about esmshard's code re-runs a finished shard.
NUMERICS_VERSION = 1

INTEGER = re.compile(r"[+-]?\d+")
BOOLEANS = {"true": True, "false": False}


def _valid(value, schema) -> bool:
    return jsonschema.Draft202012Validator(schema).is_valid(value)


def coerce(value, schema: dict):
    """`value` in the form `schema` asks for, where it has one; otherwise `value` unchanged."""
    if _valid(value, schema):
        return value
    for option in schema.get("oneOf", []) + schema.get("anyOf", []):
        candidate = coerce(value, option)
        if _valid(candidate, option):
            return candidate
    kind = schema.get("type")
    if kind == "array":
        items = value if isinstance(value, list) else [value]
        return [coerce(item, schema.get("items", {})) for item in items]
    if kind == "integer" and isinstance(value, str) and INTEGER.fullmatch(value.strip()):
        return int(value)
    if kind == "boolean" and isinstance(value, str) and value.strip().lower() in BOOLEANS:
        return BOOLEANS[value.strip().lower()]
    if kind == "string" and isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)  # e.g. outdir=2024
    return value


def coerce_config(config: dict, schema: dict) -> dict:
    """The config's keys that the schema knows, coerced; unknown keys are left for validation."""
    properties = schema.get("properties", {})
    return {
        key: coerce(value, properties[key]) if key in properties else value
        for key, value in config.items()
    }


class ConfigError(ValueError):
    """Settings that cannot work together, or with the model; the message says what to change."""


def for_family(config: dict, family) -> dict:
    """The settings that depend on the model's family (esmshard.models.spec.Family), made
    concrete: `truncation_seq_length: auto` is its limit. ConfigError where the family or the
    other settings refuse them."""
    limit = config["truncation_seq_length"]
    limit = family.max_residues if limit == "auto" else limit
    if limit > family.max_residues and family.positions_end:
        raise ConfigError(
            f"truncation_seq_length {limit} is beyond {family.title}'s {family.max_residues} "
            f"residues (the longest it was trained on); use at most {family.max_residues}, or "
            "auto, and long_sequences: chunk for longer sequences"
        )
    if "contacts" in config["include"] and not family.contacts:
        raise ConfigError(
            f"include: contacts: {family.title} ({config['model']}) has no contact head; contact "
            "maps come from ESM-2 models. Remove contacts from include, or use an ESM-2 model"
        )
    if "bos" in config["include"] and not family.bos:
        raise ConfigError(
            f"include: bos: {family.title} ({config['model']}) has no BOS token (its sequences "
            "are the residues and </s>); remove bos from include, and use mean for one vector "
            "per protein"
        )
    if "contacts" in config["include"] and config["long_sequences"] == "chunk":
        raise ConfigError(
            "include: contacts cannot be combined with long_sequences: chunk (a contact map "
            "spans the whole sequence, a window sees part of it); use long_sequences: truncate, "
            "as fair-esm's extract does, or skip"
        )
    return {**config, "truncation_seq_length": limit}


def embedding_settings(config: dict, family: str, checkpoint: str) -> dict:
    """The settings an embedding was computed with, as embed jobs record them and merge checks them.

    Keys in sorted order: Snakemake compares params by their repr(), so one order for good.
    """
    settings = {
        **{key: config[key] for key in EMBEDDING_KEYS},
        "checkpoint": checkpoint,
        "family": family,
        "numerics": NUMERICS_VERSION,
    }
    return dict(sorted(settings.items()))


PATH_KEYS = ("input", "outdir", "store", "model")  # `model` may also name a hub model


def expand_home(config: dict) -> dict:
    """The path keys of `config` with a leading `~` expanded, as the shell would."""
    expanded = {}
    for key in PATH_KEYS:
        value = config.get(key)
        if isinstance(value, str):
            expanded[key] = os.path.expanduser(value)
        elif isinstance(value, list):
            expanded[key] = [os.path.expanduser(v) for v in value]
    return expanded
