rule merge:
    input:
        records=RUN.records,
        shards=expand(RUN.shard_h5("{shard}"), shard=SHARDS),
    output:
        embeddings=RUN.embeddings,
        failed=RUN.failed,
    resources:
        runtime=io_runtime,
        mem_mb=4096,
    log:
        RUN.log("merge"),
    conda:
        "../../envs/esmshard.yaml"
    script:
        "../scripts/merge.py"
