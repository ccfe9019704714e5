rule variants:
    input:
        unpack(variants_inputs),
    output:
        tsv=RUN.variant_scores,
        parquet=directory(RUN.variant_scores_parquet),
        summary=RUN.variant_summary,
    log:
        RUN.log("variants"),
    conda:
        "../../envs/esmshard.yaml"
    resources:
        runtime=io_runtime,
    params:
        variants=config["variants"],
        strategies=config["variant_scoring"],
        offset=config["variant_offset"],
        window=config["truncation_seq_length"],
    script:
        "../scripts/variants.py"


# `pseudo_ppl`: the mutant sequences as a FASTA file, then the records' own shard, embed and
# merge steps over it, with their pseudo-log-likelihoods alone (MUTANT_PARAMS).
rule mutant_sequences:
    input:
        unpack(variant_table_inputs),
    output:
        MUTANTS.mutant_sequences,
    log:
        MUTANTS.log("mutant_sequences"),
    conda:
        "../../envs/esmshard.yaml"
    resources:
        runtime=io_runtime,
    params:
        variants=config["variants"],
        limit=SCORED_LIMIT,
        offset=config["variant_offset"],
        strategies=config["variant_scoring"],
        window=config["truncation_seq_length"],
    script:
        "../scripts/mutant_sequences.py"


checkpoint shard_mutants:
    input:
        MUTANTS.mutant_sequences,
    output:
        directory(MUTANTS.shard_dir),
    log:
        MUTANTS.log("shard"),
    conda:
        "../../envs/esmshard.yaml"
    threads: START.shard_threads()
    resources:
        runtime=io_runtime,
        mem_mb=shard_mem_mb,
    params:
        **shard_params([MUTANTS.mutant_sequences], MUTANT_PARAMS),
    script:
        "../scripts/shard.py"


use rule embed as embed_mutants with:
    input:
        shard=MUTANTS.shard_tsv("{shard}"),
        plan=MUTANTS.plan,
    output:
        embeddings=in_store(STORE.part(MUTANT_KEY, "{shard}")),
        manifest=in_store(STORE.manifest(MUTANT_KEY, "{shard}")),
        metrics=MUTANTS.metrics("{shard}"),
        telemetry=MUTANTS.telemetry("{shard}"),
        progress=MUTANTS.progress("{shard}"),
    log:
        MUTANTS.log("embed", "{shard}"),
    params:
        **MUTANT_PARAMS,


use rule merge as merge_mutants with:
    input:
        unpack(lambda wildcards: merge_inputs_of("shard_mutants", MUTANTS, MUTANT_KEY)),
    output:
        embeddings=MUTANTS.embeddings,
        failed=MUTANTS.failed,
        run=MUTANTS.run_json,
    log:
        MUTANTS.log("merge"),
    params:
        **MUTANT_PARAMS,
        store=STORE.root,
        output_dtype="float32",
        output_values="copy",
        per_residue_compression=config["per_residue_compression"],
        contacts_dtype=config["contacts_dtype"],
