rule embed:
    input:
        shard=RUN.shard_tsv("{shard}"),
        plan=RUN.plan,
    output:
        embeddings=RUN.shard_h5("{shard}"),
        metrics=RUN.metrics("{shard}"),
        telemetry=RUN.telemetry("{shard}"),
        progress=RUN.progress("{shard}"),
    params:
        **EMBEDDING_PARAMS,
    resources:
        gpu=1,
        runtime=embed_runtime,
        mem_mb=embed_mem_mb(*ARCH),
    threads: 2
    log:
        RUN.log("embed", "{shard}"),
    conda:
        "../../envs/esmshard.yaml"
    script:
        "../scripts/embed.py"
