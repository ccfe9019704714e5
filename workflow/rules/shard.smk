rule shard:
    input:
        INPUTS,
    output:
        shards=expand(RUN.shard_tsv("{shard}"), shard=SHARDS),
        records=RUN.records,
        plan=RUN.plan,
    log:
        RUN.log("shard"),
    conda:
        "../../envs/esmshard.yaml"
    resources:
        runtime=io_runtime,
        # streaming: at most ~32 bytes per record (esmshard.shard)
        mem_mb=lambda wildcards: 2048 + math.ceil(32 * N_RECORDS_ESTIMATE / 2**20),
    params:
        # New content under an old mtime re-runs this step too (esmshard.checksums).
        input_sha256=input_checksums(INPUTS, RUN.input_checksums),
        n_shards=N_SHARDS,
        model=config["model"],
        truncation_seq_length=config["truncation_seq_length"],
        long_sequences=config["long_sequences"],
        nucleotide_check=config["nucleotide_check"],
    script:
        "../scripts/shard.py"
