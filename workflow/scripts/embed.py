from esmshard.steps.job import run_step

run_step(
    snakemake.log[0],
    "esmshard.steps.object_store:run_shard",
    shard_tsv=snakemake.input.shard,
    outdir=snakemake.config["outdir"],
    out_h5=snakemake.output.embeddings,
    manifest_json=snakemake.output.manifest,
    metrics_json=snakemake.output.metrics,
    telemetry_tsv=snakemake.output.telemetry,
    progress_json=snakemake.output.progress,
    shard=snakemake.wildcards.shard,
    gpus=snakemake.config["gpus"],
    toks_per_batch=snakemake.config["toks_per_batch"],
    batching=snakemake.config["batching"],
    compile=snakemake.config["compile"],
    keep_every=snakemake.config["keep_every"],
    threads=snakemake.threads,
    settings=dict(snakemake.params.items()),
)
