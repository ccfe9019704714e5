# A checkpoint: which shards there are is known only once the input and the store are read.
checkpoint shard:
    input:
        INPUTS,
    output:
        directory(RUN.shard_dir),
    log:
        RUN.log("shard"),
    conda:
        "../../envs/esmshard.yaml"
    # the processes that read the inputs at once
    threads: shard_threads()
    resources:
        runtime=io_runtime,
        # streaming: at most ~32 bytes per record (esmshard.steps.shard), and each reading
        # process's ~400 MB
        mem_mb=lambda wildcards, threads: records_mem_mb(32)(wildcards) + 400 * threads,
    params:
        **shard_params(INPUTS, EMBEDDING_PARAMS),
    script:
        "../scripts/shard.py"
