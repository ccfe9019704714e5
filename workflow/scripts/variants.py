from esmshard.steps.job import run_step

run_step(
    snakemake.log[0],
    "esmshard.steps.variants:score_variants",
    embeddings=snakemake.input.embeddings,
    inputs=list(snakemake.input.inputs),
    variants=snakemake.params.variants,
    strategies=list(snakemake.params.strategies),
    out_tsv=snakemake.output.tsv,
    out_folder=snakemake.output.parquet,
    out_summary=snakemake.output.summary,
    mutants=snakemake.input.get("mutants"),
    offset=snakemake.params.offset,
    window=snakemake.params.window,
)
