from esmshard.outputs.nearest import Tables
from esmshard.steps.job import run_step

run_step(
    snakemake.log[0],
    "esmshard.steps.neighbours:write_neighbours",
    parts=list(snakemake.input.parts),
    queries_h5=snakemake.input.queries,
    reference_h5=snakemake.input.reference,
    reference_name=snakemake.params.reference,
    annotations=snakemake.input.get("annotations"),
    tables=Tables(
        snakemake.output.tsv,
        snakemake.output.parquet,
        snakemake.output.annotations[0] if snakemake.output.annotations else None,
    ),
    k=snakemake.params.k,
    metric=snakemake.params.metric,
    unwritten=list(snakemake.params.unwritten),
    transfer=snakemake.params.transfer,
    transfer_files=list(snakemake.output.transfer),
)
