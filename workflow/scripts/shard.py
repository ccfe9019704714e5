import sys
from pathlib import Path

# esmshard from this workflow's own folder, ahead of any installed copy.
sys.path.insert(0, str(Path(snakemake.scriptdir).resolve().parents[1]))

from esmshard import run_step
from esmshard.model import ensure_available, parse_spec
from esmshard.shard import write_shards
from esmshard.sizing import DEFAULT_ARCH


def shard(
    inputs, shard_dir, n_shards, model, truncation_seq_length, long_sequences, nucleotide_check
):
    spec = parse_spec(model)
    # Weights first: a model that cannot be had stops the run before any shard work.
    ensure_available(spec)
    embed_dim = spec.embed_dim or DEFAULT_ARCH[1]
    write_shards(
        inputs,
        shard_dir,
        n_shards,
        truncation_seq_length,
        embed_dim,
        long_sequences,
        nucleotide_check,
    )


params = dict(snakemake.params.items())
del params["input_sha256"]  # there to re-run this step when an input's content changes
run_step(
    snakemake.log[0],
    shard,
    inputs=list(snakemake.input),
    shard_dir=Path(snakemake.output.records).parent,
    **params,
)
