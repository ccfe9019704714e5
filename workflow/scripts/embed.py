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
    progress_json=f"{snakemake.config['outdir']}/running/{snakemake.wildcards.shard}.json",
    telemetry_tsv=f"{snakemake.config['outdir']}/telemetry/{snakemake.wildcards.shard}.tsv",
    **dict(snakemake.params.items()),
)
