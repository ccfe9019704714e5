"""`esmshard.embed`: embeddings in the calling process, by the workflow's own steps.

    emb = esmshard.embed({"P1": "MKTAYIAKQR", "P2": "MSHHWGYGKH"}, "esm2_t33_650M_UR50D")
    emb["P1"].mean[33]

The sequences go through the shard step (the same input checks, deduplication and store), one
embed job per shard on a device of the GPU pool (the same batching, precision, long-sequence
policy and out-of-memory back-off), and the merge step, in a temporary folder; the result is
read like `esmshard.open_embeddings` and held in memory. Settings take the workflow's config
keys and defaults (config/config.yaml), validated by the same schema.
"""

import csv
import io
import os
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path

import yaml

from ..config import ConfigError, coerce_config, embedding_settings, for_family
from ..input.fasta import FastaError, looks_nucleotide, normalise, not_a_file, printable
from ..input.sizing import ModelSize
from ..layout import Layout
from ..models import ensure_available, parse_spec
from ..outputs.reader import Embeddings
from ..steps.embed import run_shard
from ..steps.merge import merge
from ..steps.shard import write_shards
from ..store import Store, settings_key
from .launch import workflow_root

Sequences = Mapping[str, str] | Iterable[tuple[str, str]] | str | os.PathLike


def settings_of(options: dict) -> dict:
    """The workflow's config: its schema's defaults, then `options`, coerced and validated."""
    import jsonschema

    with open(workflow_root() / "workflow" / "schemas" / "config.schema.yaml") as fh:
        schema = yaml.safe_load(fh)
    defaults = {k: v["default"] for k, v in schema["properties"].items() if "default" in v}
    config = coerce_config({**defaults, **options}, schema)
    for error in jsonschema.Draft202012Validator(schema).iter_errors(config):
        where = ".".join(str(p) for p in error.absolute_path) or "settings"
        raise ConfigError(f"{where}: {error.message}")
    return config


def fasta_of(sequences: Sequences, folder: Path, nucleotide_check: bool) -> Path:
    """A FASTA path as given, or the sequences written as one (each ID checked first)."""
    if isinstance(sequences, (str, os.PathLike)):
        path = Path(sequences).expanduser()
        problem = not_a_file(path)
        if problem:
            raise FastaError(f"{path}: {problem}")
        return path
    pairs = sequences.items() if isinstance(sequences, Mapping) else sequences
    path = folder / "sequences.fasta"
    n, seen = 0, set()
    with open(path, "w") as fh:
        for n, pair in enumerate(pairs, 1):
            try:
                id_, sequence = pair
            except (TypeError, ValueError):
                raise ValueError(
                    f"item {n} of the sequences is not an (ID, sequence) pair: {pair!r:.60}"
                ) from None
            if not isinstance(id_, str) or not id_ or any(c.isspace() for c in id_):
                raise ValueError(f"sequence {n}: its ID {id_!r:.60} is not one word of text")
            if id_ in seen:
                raise ValueError(f"sequence {n}: the ID {printable(id_)} is given twice")
            seen.add(id_)
            if not isinstance(sequence, str) or not sequence.strip():
                raise ValueError(f"sequence {printable(id_)} is empty (or not text)")
            normalise(sequence, f"sequence {printable(id_)}")  # the shard step's letters
            if nucleotide_check and looks_nucleotide(sequence):
                raise ValueError(
                    f"sequence {printable(id_)} looks like nucleotides (only A, C, G, T, U, N): "
                    "translate it first, or pass nucleotide_check=False to embed it anyway"
                )
            fh.write(f">{id_}\n{sequence}\n")
    if n == 0:
        raise ValueError("no sequences were given")
    return path


def embed(
    sequences: Sequences,
    model: str = "esm2_t33_650M_UR50D",
    *,
    repr_layers: Iterable[int] = (-1,),
    include: Iterable[str] = ("mean",),
    store: str | os.PathLike | None = None,
    **settings,
) -> Embeddings:
    """Embed `sequences` with `model` in this process; the result reads like
    `esmshard.open_embeddings` (`result[id].mean[layer]`, `result.array("mean")`), and its
    `failed` maps each record that could not be embedded to the reason.

    `sequences`: a mapping of ID to sequence, (ID, sequence) pairs, or a FASTA file's path.
    `model`: as the workflow's `model` key (a name, `hf:`, a folder or checkpoint, `random:`).
    `store`: a folder that keeps what is computed, so that a later call (or run) reuses it;
    None computes everything and keeps nothing. `settings`: any other config key (precision,
    truncation_seq_length, long_sequences, toks_per_batch, batching, compile, gpus, fast_path,
    nucleotide_check, output_dtype, ...), as config/config.yaml documents them.

    Bad input raises ValueError (esmshard.input.fasta.FastaError for files), a model that
    cannot be had esmshard.models.ModelError, and settings that do not fit ConfigError, each
    naming what to change.
    """
    import torch

    with tempfile.TemporaryDirectory(prefix="esmshard-embed-") as tmp:
        tmp = Path(tmp)
        fasta = fasta_of(sequences, tmp, settings.get("nucleotide_check", True) is not False)
        options = {"model": str(model), "repr_layers": [int(x) for x in repr_layers]}
        options |= {"include": list(include), "input": [str(fasta)], "outdir": str(tmp / "out")}
        spec = parse_spec(options["model"])
        config = for_family(settings_of({**settings, **options}), spec.family)
        ensure_available(spec)
        run = Layout(config["outdir"])
        store = Store(str(Path(store).expanduser()) if store else str(tmp / "store"))
        params = embedding_settings(config, spec.family.name, spec.identity(run.checksums))
        plan = write_shards(
            [fasta],
            run.shard_dir,
            config["shards"],
            config["truncation_seq_length"],
            ModelSize(spec.params, spec.embed_dim),
            store.root,
            params,
            run.checksums,
            config["long_sequences"],
            config["nucleotide_check"],
        )
        key = settings_key(params)
        for shard in (p["shard"] for p in plan["shards"]):
            run_shard(
                run.shard_tsv(shard),
                store.part(key, shard),
                store.manifest(key, shard),
                run.metrics(shard),
                shard=shard,
                settings=params,
                toks_per_batch=config["toks_per_batch"],
                gpus=config["gpus"],
                batching=config["batching"],
                compile=config["compile"],
                threads=torch.get_num_threads(),  # the caller's, left as they are
                progress_json=run.progress(shard),
                telemetry_tsv=run.telemetry(shard),
                outdir=run.outdir,
            )
        merge(
            run.records,
            run.plan_json,
            store.root,
            run.embeddings,
            run.failed,
            run.run_json,
            params,
            run.checksums,
            config["output_dtype"],
            config["per_residue_compression"],
            config["contacts_dtype"],
            [run.metrics(p["shard"]) for p in plan["shards"]],
        )
        with open(run.failed, newline="") as fh:
            failed = {row["id"]: row["reason"] for row in csv.DictReader(fh, delimiter="\t")}
        return Embeddings(io.BytesIO(Path(run.embeddings).read_bytes()), failed)
