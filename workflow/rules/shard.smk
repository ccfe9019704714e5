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
        # one row per record (~200 bytes) plus the ID index
        mem_mb=lambda wildcards, input: 2048 + math.ceil(2 * input.size_mb),
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
