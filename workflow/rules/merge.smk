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
        # windows of 256 MB and ~13 bytes per record (esmshard.merge)
        mem_mb=lambda wildcards: 2048 + math.ceil(32 * N_RECORDS_ESTIMATE / 2**20),
    params:
        **EMBEDDING_PARAMS,
        output_dtype=config["output_dtype"],
        per_residue_compression=config["per_residue_compression"],
    script:
        "../scripts/merge.py"
