from esmshard.layout import Layout
from esmshard.steps.job import run_step
from esmshard.steps.neighbours import Search

run_step(
    snakemake.log[0],
    "esmshard.steps.neighbours:search_part",
    queries_h5=snakemake.input.queries,
    reference_h5=snakemake.input.reference,
    out_npz=snakemake.output.hits,
    metrics_json=snakemake.output.metrics,
    part=snakemake.wildcards.part,
    search=Search(
        snakemake.params.k,
        snakemake.params.metric,
        snakemake.params.layer,
        snakemake.params.reference,
        snakemake.params.extra,
        snakemake.params.index,
    ),
    gpus=snakemake.config["gpus"],
    annotations=snakemake.input.get("annotations"),
    transfer=snakemake.params.transfer,
    run_lock=Layout(snakemake.config["outdir"]).run_lock,
)
