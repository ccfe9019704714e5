rule merge:
    input:
        records=f"{OUT}/shards/records.tsv",
        shards=expand(f"{OUT}/embeddings/{{shard}}.h5", shard=SHARDS),
    output:
        embeddings=EMBEDDINGS,
        failed=FAILED,
    log:
        f"{OUT}/logs/merge.log",
    conda:
        "../../envs/esmshard.yaml"
    script:
        "../scripts/merge.py"
