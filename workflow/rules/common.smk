import math
import os
from pathlib import Path

from snakemake.common.tbdstring import TBDString
from snakemake.exceptions import WorkflowError
from snakemake.utils import validate

from esmshard.model import ModelError, parse_spec
from esmshard.shard import (
    DEFAULT_ARCH,
    auto_shard_count,
    embed_mem_mb,
    embed_runtime_minutes,
    estimated_residues,
    read_tsv,
    shard_names,
)

validate(config, schema="../schemas/config.schema.yaml")

INPUTS = [config["input"]] if isinstance(config["input"], str) else list(config["input"])
for path in INPUTS:
    if not os.path.isfile(path):
        raise WorkflowError(f"input FASTA '{path}' does not exist; set `input:` in the config")
try:
    MODEL = parse_spec(config["model"])
except ModelError as err:
    raise WorkflowError(str(err))

OUT = config["outdir"]
N_SHARDS = (
    auto_shard_count(estimated_residues(INPUTS)) if config["shards"] == "auto" else config["shards"]
)
SHARDS = shard_names(N_SHARDS)
EMBEDDINGS = f"{OUT}/embeddings.h5"
FAILED = f"{OUT}/failed_sequences.tsv"
SCALING_JSON = f"{OUT}/report/scaling.json"
SCALING_HTML = f"{OUT}/report/scaling_report.html"

# Settings that change the embeddings; a change re-runs the shards (Snakemake's params trigger).
# `gpus` and `toks_per_batch` are read from the config inside the job instead, so that moving
# to other GPUs or another batch size never invalidates finished shards.
EMBEDDING_PARAMS = {
    "model": config["model"],
    "repr_layers": config["repr_layers"],
    "include": config["include"],
    "truncation_seq_length": config["truncation_seq_length"],
    "long_sequences": config["long_sequences"],
    "precision": config["precision"],
    "fast_path": config["fast_path"],
}


wildcard_constraints:
    shard=r"shard_\d+",


# Cluster resources (used by profiles/slurm; a profile's set-resources overrides them).
ARCH = (MODEL.num_layers, MODEL.embed_dim) if MODEL.num_layers else DEFAULT_ARCH


def embed_runtime(wildcards, input, attempt):
    plan_tsv = Path(input[0]).parent / "plan.tsv"
    if not plan_tsv.is_file():
        return TBDString()  # before sharding; Snakemake evaluates it again once the input exists
    plan = {row["shard"]: row for row in read_tsv(plan_tsv)}
    return embed_runtime_minutes(float(plan[wildcards.shard]["estimated_cost"]), *ARCH, attempt)


def io_runtime(wildcards, input, attempt):
    """Minutes for a step that streams its inputs once: 10 plus a minute per 200 MB."""
    return math.ceil(10 + input.size_mb / 200) * attempt


def report_failures():
    with open(FAILED) as fh:
        n_failed = sum(1 for _ in fh) - 1
    logger.info(f"esmshard: {n_failed} sequences failed; the list is in {FAILED}")
