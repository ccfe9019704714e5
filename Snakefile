# esmshard: FASTA -> size-balanced shards -> one GPU job per shard -> merged HDF5 -> scaling report.
import os

from snakemake.utils import min_version

min_version("9.0")


# Found beside this Snakefile also when the run's working directory is elsewhere (-d).
configfile: os.path.join(workflow.basedir, "config", "config.yaml")


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
