rule merge:
    input:
        records=RUN.records,
        shards=expand(RUN.shard_h5("{shard}"), shard=SHARDS),
    output:
        embeddings=RUN.embeddings,
        failed=RUN.failed,
    log:
        RUN.log("merge"),
    conda:
        "../../envs/esmshard.yaml"
    resources:
        runtime=io_runtime,
        mem_mb=4096,
    params:
        **EMBEDDING_PARAMS,
    script:
        "../scripts/merge.py"
