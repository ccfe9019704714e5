from esmshard import run_step
from esmshard.model import ensure_available, parse_spec
from esmshard.shard import DEFAULT_ARCH, write_shards


def shard(inputs, shard_dir, n_shards, model, truncation_seq_length, long_sequences):
    spec = parse_spec(model)
    # Weights first: a model that cannot be had stops the run before any shard work.
    ensure_available(spec)
    write_shards(inputs, shard_dir, n_shards, truncation_seq_length, spec.embed_dim or DEFAULT_ARCH[1], long_sequences)


run_step(
    snakemake.log[0],
    shard,
    inputs=list(snakemake.input),
    shard_dir=snakemake.output.records.rsplit("/", 1)[0],
    n_shards=snakemake.params.n_shards,
    model=snakemake.params.model,
    truncation_seq_length=snakemake.params.truncation_seq_length,
    long_sequences=snakemake.params.long_sequences,
)
