rule shard:
    input:
        INPUTS,
    output:
        shards=expand(f"{OUT}/shards/{{shard}}.tsv", shard=SHARDS),
        records=f"{OUT}/shards/records.tsv",
        plan=f"{OUT}/shards/plan.tsv",
    params:
        n_shards=N_SHARDS,
        model=config["model"],
        truncation_seq_length=config["truncation_seq_length"],
        long_sequences=config["long_sequences"],
    resources:
        runtime=io_runtime,
        # one row per record (~200 bytes) plus the ID index
        mem_mb=lambda wildcards, input: 2048 + math.ceil(2 * input.size_mb),
    log:
        f"{OUT}/logs/shard.log",
    conda:
        "../../envs/esmshard.yaml"
    script:
        "../scripts/shard.py"
