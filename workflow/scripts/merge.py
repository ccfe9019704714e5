from esmshard.layout import Layout
from esmshard.steps.job import run_step

settings = dict(snakemake.params.items())
output = {
    key: settings.pop(key)
    for key in ("output_dtype", "output_values", "per_residue_compression", "contacts_dtype")
}
store_root = settings.pop("store")
run = Layout(snakemake.config["outdir"])
run_step(
    snakemake.log[0],
    "esmshard.steps.object_store:merge_step",
    records=snakemake.input.records,
    plan_json=snakemake.input.plan,
    store_root=store_root,
    out_h5=snakemake.output.embeddings,
    failed_tsv=snakemake.output.failed,
    run_json=snakemake.output.run,
    settings=settings,
    checksum_cache=run.checksums,
    metrics_files=list(snakemake.input.metrics),
    run_lock=run.run_lock,
    **output,
)
