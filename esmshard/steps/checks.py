"""Everything a run's config says, checked before any job: keys and values, the model and its
shape, the settings against the model's family, the outdir, the store and the input files.

Every problem is one line that names the key or file and what to do, and all are found at once
(a value that cannot be read leaves unchecked only what depends on it): the workflow prints them
when Snakemake reads it, before a job waits for a GPU.
"""

import os
from itertools import islice
from typing import NamedTuple

from ..config import (
    coerce_config,
    expand_home,
    family_problems,
    for_family,
    layer_problems,
    schema_problems,
)
from ..files import unwritable
from ..input.fasta import FastaError, looks_nucleotide, not_a_file, printable, read_raw
from ..input.long_sequences import scored_limit
from ..input.variants import ALL, PLLR, STRATEGIES, variant_kinds
from ..input.variants import problems as variant_problems
from ..layout import Layout
from ..models import (
    ModelError,
    attention_problems,
    contact_problems,
    file_problems,
    fit_problems,
    length_problems,
    parse_spec,
    score_problems,
)
from ..models.spec import ModelSpec
from ..store import Store, written_by_layout, written_by_run
from ..store.storelock import locks_problem
from .neighbour_checks import neighbour_problems

# Records of each input read when the workflow is read: a nucleotide file shows in its first ones
# (the shard step still checks every record).
PEEK_RECORDS = 20


class Checked(NamedTuple):
    """A config as the run uses it, its model, and what is wrong with it (one line each)."""

    config: dict
    model: ModelSpec | None
    problems: list[str]


def defaults(schema: dict) -> dict:
    """The config keys' defaults, as the schema gives them."""
    return {k: v["default"] for k, v in schema["properties"].items() if "default" in v}


# what the neighbours checks read
NEIGHBOUR_KEYS = {
    "neighbours",
    "neighbours_layer",
    "neighbours_annotations",
    "neighbours_terms",
    "neighbours_transfer",
    "neighbours_max_distance",
    "neighbours_ontology",
    "neighbours_index",
    "include",
    "repr_layers",
}


def check_config(
    config: dict, schema: dict, inputs: bool = True, model: ModelSpec | None = None
) -> Checked:
    """`config` coerced from what users type, `~` expanded, `truncation_seq_length` made concrete,
    and every problem found; `inputs` False leaves the input files unread (`snakemake --lint`);
    `model`, where given, is what `config["model"]` names, already read."""
    config = coerce_config(config, schema)
    found = schema_problems(config, schema)
    problems = list(found.values())
    valid = {key for key in config if key not in found}
    config.update(expand_home({key: config[key] for key in valid}))
    if model is None and "model" in valid:
        try:
            model = parse_spec(config["model"])
        except ModelError as err:
            problems.append(str(err))
    if model is not None:  # its files, as they lie, and as its loader reads them
        problems += file_problems(model) or fit_problems(model)
    if model is not None and valid >= {"include", "truncation_seq_length", "long_sequences"}:
        problems += family_problems(config, model.family)
        if "contacts" in config["include"]:
            problems += contact_problems(model)
        problems += score_problems(model, config["include"])
        if valid >= {"variants", "variant_scoring"} and config["variants"]:
            read = [
                k for k in variant_kinds(config["variant_scoring"]) if k not in config["include"]
            ]
            problems += score_problems(model, read, asked_by="variant_scoring")
        if valid >= {"attention_layers", "attention_heads"}:
            problems += attention_problems(model, config)
        problems += length_problems(model, config["truncation_seq_length"])
    if model is not None and model.num_layers and "repr_layers" in valid:
        problems += layer_problems(config["repr_layers"], model.name, model.num_layers)
    if valid >= {"outdir", "store"}:
        run = Layout(config["outdir"])
        store = Store(config["store"] or os.path.join(config["outdir"], "store"))
        folder_problems = place_problems(run, store)
        problems += folder_problems
        if inputs and "input" in valid and not folder_problems:
            check = config.get("nucleotide_check") is not False
            for path in config["input"]:
                problems += input_problems(path, run, store, check)
    if valid >= {"variants", "variant_scoring", "include"} and config["variants"]:
        # the scores its strategies read, kept with the embeddings
        needed = [STRATEGIES[name] for name in config["variant_scoring"] if name in STRATEGIES]
        config["include"] = [
            *config["include"],
            *(k for k in needed if k not in config["include"]),
        ]
    if valid >= {"variants", "variant_scoring"} and config["variants"] == ALL:
        if PLLR in config["variant_scoring"]:
            problems.append(
                "variant_scoring: pllr scores a variants table's rows (indels, multi-residue "
                "changes); variants: all is every single substitution, which wt_marginals "
                "scores as the catalogues do: leave out pllr, or give a table"
            )
    if valid >= NEIGHBOUR_KEYS:
        problems += neighbour_problems(config, model)
    if not problems:
        config = for_family(config, model.family)
        if inputs and config["variants"] not in ("", ALL):
            limit = scored_limit(config["truncation_seq_length"], config["long_sequences"])
            problems += variant_problems(
                config["variants"], config["input"], limit, config["variant_offset"]
            )
    return Checked(config, model, problems)


def place_problems(run: Layout, store: Store) -> list[str]:
    """Why the outdir or the store cannot hold this run's files."""
    for key, folder in (("outdir", run.outdir), ("store", store.root)):
        if os.path.exists(folder) and not os.path.isdir(folder):
            return [f"{key} '{folder}' is a file; choose a folder for `{key}`"]
    problem = unwritable(run.outdir)
    if problem:
        return [f"outdir '{run.outdir}': {problem}; choose a folder you can write for `outdir`"]
    locks = locks_problem(store.root)
    if locks:
        return [f"store: {locks}"]
    inside = written_by_layout(store.root, run)
    if inside:
        return [
            f"store '{store.root}' is where this run writes its own files ({inside}), which "
            "would replace or remove it; choose another `store` (by default the outdir's store/)"
        ]
    return []


def input_problems(path: str, run: Layout, store: Store, nucleotide_check: bool) -> list[str]:
    """Why `path` cannot be this run's input: no file, where the run writes, or (where
    `nucleotide_check`) nucleotides in its first records."""
    problem = not_a_file(path)
    if problem:
        return [f"input FASTA '{path}' {problem}; set `input` to your protein FASTA files"]
    written = written_by_run(path, run, store)
    if written:
        return [
            f"input FASTA '{path}' is where this run writes ({written}): the run would "
            "overwrite or remove it. Move the input elsewhere, or choose another `outdir` "
            "or `store`"
        ]
    if not nucleotide_check:
        return []
    try:
        first = list(islice(read_raw(path), PEEK_RECORDS))
    except FastaError:
        return []  # the shard step names the record, with every other one
    nucleotide = [record for record in first if looks_nucleotide(record.sequence)]
    if nucleotide:
        return [
            f"input FASTA '{path}' holds nucleotide sequences ({len(nucleotide)} of its first "
            f"{len(first)} records, e.g. '{printable(nucleotide[0].id)}', are only A, C, G, T, U, N): give "
            "the protein file (.faa), translate it first, or set nucleotide_check: false"
        ]
    return []
