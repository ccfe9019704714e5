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
    threads: START.shard_threads()
    resources:
        runtime=io_runtime,
        mem_mb=shard_mem_mb,
    params:
        **shard_params(INPUTS, EMBEDDING_PARAMS),
    script:
        "../scripts/shard.py"


# `esmshard plan`'s target: every shard step of the run (the mutants' too, where pseudo_ppl or
# pllr scores them), so that its dry run lists every embed job.
rule planned:
    input:
        [RUN.shard_dir, MUTANTS.shard_dir] if MUTANTS_WANTED else [RUN.shard_dir],
