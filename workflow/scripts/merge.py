from esmshard import run_step
from esmshard.merge import merge

run_step(
    snakemake.log[0],
    merge,
    records_tsv=snakemake.input.records,
    shard_files=list(snakemake.input.shards),
    out_h5=snakemake.output.embeddings,
    failed_tsv=snakemake.output.failed,
)
