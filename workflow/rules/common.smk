import os

from snakemake.exceptions import WorkflowError
from snakemake.utils import validate

from esmshard.model import ModelError, parse_spec
from esmshard.shard import auto_shard_count, estimated_residues, shard_names

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
}


wildcard_constraints:
    shard=r"shard_\d+",


def report_failures():
    with open(FAILED) as fh:
        n_failed = sum(1 for _ in fh) - 1
    logger.info(f"esmshard: {n_failed} sequences failed; the list is in {FAILED}")
