import sys
from pathlib import Path

# esmshard from this workflow's own folder, ahead of any installed copy.
sys.path.insert(0, str(Path(snakemake.scriptdir).resolve().parents[1]))

from esmshard import run_step
from esmshard.merge import merge

run_step(
    snakemake.log[0],
    merge,
    records_tsv=snakemake.input.records,
    shard_files=list(snakemake.input.shards),
    out_h5=snakemake.output.embeddings,
    failed_tsv=snakemake.output.failed,
    settings=dict(snakemake.params.items()),
)
