from esmshard.layout import Layout
from esmshard.steps.job import run_step

params = dict(snakemake.params.items())
del params["input_sha256"]  # there to re-run this step when an input's content changes
run_step(
    snakemake.log[0],
    "esmshard.steps.object_store:shard_step",
    inputs=list(snakemake.input),
    shard_dir=snakemake.output[0],
    store_root=params.pop("store"),
    checksum_cache=Layout(snakemake.config["outdir"]).checksums,
    workers=snakemake.threads,
    **params,
)
