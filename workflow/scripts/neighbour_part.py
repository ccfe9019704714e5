from esmshard.steps.job import run_step

run_step(
    snakemake.log[0],
    "esmshard.steps.neighbours:search_part",
    queries_h5=snakemake.input.queries,
    reference_h5=snakemake.input.reference,
    out_npz=snakemake.output.hits,
    metrics_json=snakemake.output.metrics,
    part=snakemake.wildcards.part,
    k=snakemake.params.k,
    metric=snakemake.params.metric,
    layer=snakemake.params.layer,
    gpus=snakemake.config["gpus"],
)
