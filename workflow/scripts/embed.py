from esmshard import run_step
from esmshard.embed import run_shard

run_step(
    snakemake.log[0],
    run_shard,
    shard_tsv=snakemake.input[0],
    out_h5=snakemake.output.embeddings,
    metrics_json=snakemake.output.metrics,
    shard=snakemake.wildcards.shard,
    gpus=snakemake.config["gpus"],
    toks_per_batch=snakemake.config["toks_per_batch"],
    threads=snakemake.threads,
    **dict(snakemake.params.items()),
)
