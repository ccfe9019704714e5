"""The config as users type it, on the command line or in YAML files, with one meaning.

Snakemake reads a `--config` value that is not a plain number or boolean with YAML's base loader,
so `gpus=[0,1]` arrives as ['0', '1'] and `repr_layers=-1` as -1 where a list is expected. Each
value is turned into what the schema asks for where its text means exactly that; anything else is
left as it was, for the schema's validation to refuse with the key's name.
"""

import difflib
import os
import re

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

ATTENTION_KEYS = ("attention_layers", "attention_heads")

# Bumped by any change of esmshard that changes the numbers computed with the same settings: it is
# part of the settings (and so of the store key), which re-runs the embed jobs and keeps the
# store's older entries apart. Nothing else about esmshard's code re-runs a finished shard.
NUMERICS_VERSION = 2  # 2: ESM-2's fc1 GELU in the product's epilogue on CUDA in fp16/bf16

INTEGER = re.compile(r"[+-]?\d+")
BOOLEANS = {"true": True, "false": False}


def _valid(value, schema) -> bool:
    # imported here: each embed job imports this module (NUMERICS_VERSION) and checks no config,
    # and jsonschema's import is a tenth of a second of every job's CPU
    import jsonschema

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
    if kind == "number" and isinstance(value, str):
        try:
            return float(value)  # e.g. neighbours_max_distance=0.5 on the command line
        except ValueError:
            return value
    if kind == "boolean" and isinstance(value, str) and value.strip().lower() in BOOLEANS:
        return BOOLEANS[value.strip().lower()]
    if kind == "string" and isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)  # e.g. outdir=2024
    if kind == "string" and isinstance(value, dict) and len(value) == 1:
        # YAML reads `model=random:` as the mapping {random: None}: the text as typed
        ((name, rest),) = value.items()
        return f"{name}:" + ("" if rest in (None, "") else f" {rest}")
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


TYPE_WORDS = {
    "integer": "a whole number",
    "string": "text",
    "boolean": "true or false",
    "array": "a list",
    "object": "a mapping",
    "number": "a number",
}


def describe(schema: dict) -> str:
    """What a value of `schema` looks like, in words: "auto or a whole number of at least 1"."""
    if "const" in schema:
        return str(schema["const"])
    if "enum" in schema:
        return "one of " + ", ".join(map(str, schema["enum"]))
    options = schema.get("oneOf", []) + schema.get("anyOf", [])
    if options:
        return " or ".join(describe(option) for option in options)
    kind = schema.get("type")
    words = TYPE_WORDS.get(kind, "a value")
    if kind == "integer" and "minimum" in schema:
        words += f" of at least {schema['minimum']}"
    if kind == "string" and schema.get("minLength"):
        words = "non-empty text"
    if kind == "array":
        words = "a list of items each " + describe(schema.get("items", {}))
        words += ", at least one" if schema.get("minItems") else ""
        words += ", none twice" if schema.get("uniqueItems") else ""
    return words


def shown(value) -> str:
    """A config value as the user types it, short: [0,-1], not ['0', '-1']."""
    text = f"[{','.join(map(str, value))}]" if isinstance(value, list) else str(value)
    text = text or '""'
    return text if len(text) <= 60 else text[:57] + "..."


def schema_problems(config: dict, schema: dict) -> dict[str, str]:
    """A line for each key of `config` that `schema` does not know (naming the closest known key)
    or whose value it refuses (saying what it takes), and for each required key missing; by key,
    in the config's order."""
    properties = schema.get("properties", {})
    problems = {}
    for key, value in config.items():
        if key not in properties:
            close = difflib.get_close_matches(key, properties, n=1, cutoff=0.6)
            hint = f"did you mean {close[0]}?" if close else "see config/config.yaml for the keys"
            problems[key] = f"{key}: not a config key of esmshard; {hint}"
        elif not _valid(value, properties[key]):
            items = properties[key].get("items")
            bad = (
                [v for v in value if not _valid(v, items)]
                if items and isinstance(value, list)
                else []
            )
            what = f"{shown(value)} is not valid"
            if bad:  # the items that are not
                what = f"{shown(value)}: {', '.join(shown(v) for v in bad)} "
                what += f"{'is' if len(bad) == 1 else 'are'} not valid"
            problems[key] = f"{key}: {what}; give {describe(properties[key])}"
    for key in schema.get("required", []):
        if key not in config:
            problems[key] = f"{key}: missing; give {describe(properties[key])}"
    return problems


def fp8_problems(config: dict, family) -> list[str]:
    """Why `precision: fp8` cannot run with these settings: its products are esmshard's own
    forward pass's, of ESM-2's, ESM-1b/1v's and ESM C's layers."""
    if not family.fp8:
        return [
            f"precision: fp8: {family.title} ({config['model']}) runs in fp32, bf16 or fp16 only "
            "(FP8 products are ESM-2's, ESM-1b/1v's and ESM C's so far); use bf16"
        ]
    maps = [kind for kind in ("contacts", "attentions") if kind in config["include"]]
    if maps:
        return [
            f"precision: fp8 cannot compute include: {', '.join(maps)} (those maps come from "
            "fair-esm's own forward pass, in bf16 or fp32); remove them, or use bf16"
        ]
    if config.get("fast_path") is False:
        return [
            "precision: fp8 runs esmshard's own forward pass, and fast_path: false asks for "
            "fair-esm's: use one or the other"
        ]
    return []


def family_problems(config: dict, family) -> list[str]:
    """Why the model's family (esmshard.models.spec.Family) refuses these settings, one line
    each."""
    problems = []
    limit = config["truncation_seq_length"]
    if limit != "auto" and limit > family.max_residues and family.positions_end:
        problems.append(
            f"truncation_seq_length {limit} is beyond {family.title}'s {family.max_residues} "
            f"residues (the longest it was trained on); use at most {family.max_residues}, or "
            "auto, and long_sequences: chunk for longer sequences"
        )
    if "contacts" in config["include"] and not family.contacts:
        problems.append(
            f"include: contacts: {family.title} ({config['model']}) has no contact head; contact "
            "maps come from ESM-2 and ESM-1b models. Remove contacts from include, or use one"
        )
    if "bos" in config["include"] and not family.bos:
        problems.append(
            f"include: bos: {family.title} ({config['model']}) has no BOS token (its sequences "
            "are the residues and </s>); remove bos from include, and use mean for one vector "
            "per protein"
        )
    if config.get("precision") == "fp8":
        problems += fp8_problems(config, family)
    if "contacts" in config["include"] and config["long_sequences"] == "chunk":
        problems.append(
            "include: contacts cannot be combined with long_sequences: chunk (a contact map "
            "spans the whole sequence, a window sees part of it); use long_sequences: truncate, "
            "as fair-esm's extract does, or skip"
        )
    return problems


def layer_problems(repr_layers, model: str, num_layers: int) -> list[str]:
    """A line for each of `repr_layers` that a `num_layers`-layer model lacks (fair-esm's
    numbering: 0 the embeddings, negative from the end)."""
    return [
        f"repr_layers: layer {layer} does not exist in {model}, which has {num_layers} layers; "
        f"give 0 to {num_layers}, or -1 (the last) to -{num_layers + 1}"
        for layer in repr_layers
        if not -(num_layers + 1) <= layer <= num_layers
    ]


def for_family(config: dict, family) -> dict:
    """The settings that depend on the model's family (esmshard.models.spec.Family), made
    concrete: `truncation_seq_length: auto` is its limit. ConfigError, one line per problem,
    where the family or the other settings refuse them."""
    problems = family_problems(config, family)
    if problems:
        raise ConfigError("\n".join(problems))
    limit = config["truncation_seq_length"]
    return {**config, "truncation_seq_length": family.max_residues if limit == "auto" else limit}


def windowed_logits(config: dict) -> bool:
    """Whether long proteins' logits come from `score_windows`' recipe
    (esmshard.input.score_windows)."""
    return config["long_sequences"] == "chunk" and "logits" in config["include"]


def embedding_settings(config: dict, family: str, checkpoint: str) -> dict:
    """The settings an embedding was computed with, as embed jobs record them and merge checks them.

    Keys in sorted order: Snakemake compares params by their repr(), so one order for good.
    """
    settings = {
        **{key: config[key] for key in EMBEDDING_KEYS},
        # what the attention maps keep, where there are any (the other runs' keys unchanged)
        **{key: config[key] for key in ATTENTION_KEYS if "attentions" in config["include"]},
        # the windows of long proteins' logits, where there are any
        **({"score_windows": config["score_windows"]} if windowed_logits(config) else {}),
        "checkpoint": checkpoint,
        "family": family,
        "numerics": NUMERICS_VERSION,
    }
    return dict(sorted(settings.items()))


PATH_KEYS = ("input", "outdir", "store", "model", "variants")  # `model` may also name a hub model


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
