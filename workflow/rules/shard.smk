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
        # New content under an old mtime re-runs this step too (esmshard.store.checksums).
        input_sha256=lambda wildcards: file_checksums(INPUTS, RUN.checksums),
        shards=config["shards"],
        # embed jobs at once, on one machine or a cluster: `shards: auto` makes at least as
        # many shards (on a cluster, where the work allows)
        slots=lambda wildcards: parallel_jobs() if config["shards"] == "auto" else None,
        cluster=lambda wildcards: (
            (not workflow.local_exec or workflow.remote_exec)
            if config["shards"] == "auto"
            else None
        ),
        model_size=list(MODEL_SIZE),
        store=STORE.root,
        settings=EMBEDDING_PARAMS,
        # with attention maps: their values per pair of residues, and bytes of one in the output
        attention_values=list(attention_values(MODEL, config)),
        truncation_seq_length=config["truncation_seq_length"],
        long_sequences=config["long_sequences"],
        nucleotide_check=config["nucleotide_check"],
    script:
        "../scripts/shard.py"
