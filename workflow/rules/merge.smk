rule merge:
    input:
        unpack(lambda wildcards: merge_inputs_of("shard", RUN, KEY)),
    output:
        embeddings=RUN.embeddings,
        failed=RUN.failed,
        run=RUN.run_json,
    log:
        RUN.log("merge"),
    conda:
        "../../envs/esmshard.yaml"
    resources:
        runtime=io_runtime,
        # windows of 128 MB and 9 to 30 bytes per record (esmshard.steps.merge)
        mem_mb=lambda wildcards: records_mem_mb(INPUT_SIZES, 32),
    params:
        **EMBEDDING_PARAMS,
        store=STORE.root,
        output_dtype=config["output_dtype"],
        output_values=config["output_values"],
        per_residue_compression=config["per_residue_compression"],
        contacts_dtype=config["contacts_dtype"],
    script:
        "../scripts/merge.py"
