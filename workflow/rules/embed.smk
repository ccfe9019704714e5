rule embed:
    input:
        shard=RUN.shard_tsv("{shard}"),
        plan=RUN.plan,
    output:
        # The part is renamed into the store last: once it exists, so do the others.
        embeddings=in_store(STORE.part(KEY, "{shard}")),
        manifest=in_store(STORE.manifest(KEY, "{shard}")),
        metrics=RUN.metrics("{shard}"),
        telemetry=RUN.telemetry("{shard}"),
        progress=RUN.progress("{shard}"),
    log:
        RUN.log("embed", "{shard}"),
    conda:
        "../../envs/esmshard.yaml"
    threads: EMBED_THREADS
    resources:
        gpu=1,
        runtime=embed_runtime,
        mem_mb=embed_mem_mb(MODEL_SIZE.params),
    params:
        **EMBEDDING_PARAMS,
    script:
        "../scripts/embed.py"


# `snakemake embedded`: the shard step and every embed job, without merge (`--until embed`
# cannot name jobs that exist only once the shard step, a checkpoint, has run).
rule embedded:
    input:
        lambda wildcards: [in_store(STORE.part(KEY, shard)) for shard in planned_shards()],
