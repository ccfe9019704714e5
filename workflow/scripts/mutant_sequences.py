from esmshard.steps.job import run_step

run_step(
    snakemake.log[0],
    "esmshard.input.variants:write_mutants",
    inputs=list(snakemake.input.inputs),
    variants=snakemake.params.variants,
    limit=snakemake.params.limit,
    offset=snakemake.params.offset,
    strategies=list(snakemake.params.strategies),
    window=snakemake.params.window,
    out_fasta=snakemake.output[0],
)
