# esmshard: FASTA -> size-balanced shards -> one GPU job per shard -> merged HDF5 -> scaling report.
from snakemake.utils import min_version

min_version("9.0")


configfile: "config/config.yaml"


include: "workflow/rules/common.smk"
include: "workflow/rules/shard.smk"
include: "workflow/rules/embed.smk"
include: "workflow/rules/merge.smk"
include: "workflow/rules/report.smk"


rule all:
    input:
        EMBEDDINGS,
        FAILED,
        SCALING_JSON,
        SCALING_HTML,
    default_target: True


onsuccess:
    report_failures()
