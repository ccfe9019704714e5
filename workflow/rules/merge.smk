rule merge:
    input:
        records=f"{OUT}/shards/records.tsv",
        shards=expand(f"{OUT}/embeddings/{{shard}}.h5", shard=SHARDS),
    output:
        embeddings=EMBEDDINGS,
        failed=FAILED,
    resources:
        runtime=io_runtime,
        mem_mb=4096,
    log:
        f"{OUT}/logs/merge.log",
    conda:
        "../../envs/esmshard.yaml"
    script:
        "../scripts/merge.py"
