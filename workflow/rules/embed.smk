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
    threads: 2
    log:
        f"{OUT}/logs/embed/{{shard}}.log",
    conda:
        "../../envs/esmshard.yaml"
    script:
        "../scripts/embed.py"
