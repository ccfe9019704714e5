rule embed:
    input:
        f"{OUT}/shards/{{shard}}.tsv",
    output:
        embeddings=f"{OUT}/embeddings/{{shard}}.h5",
        metrics=f"{OUT}/metrics/{{shard}}.json",
    params:
        **EMBEDDING_PARAMS,
    resources:
        gpu=1,
        runtime=embed_runtime,
        mem_mb=embed_mem_mb(*ARCH),
    threads: 2
    log:
        f"{OUT}/logs/embed/{{shard}}.log",
    conda:
        "../../envs/esmshard.yaml"
    script:
        "../scripts/embed.py"
