rule variants:
    input:
        unpack(variants_inputs),
    output:
        tsv=RUN.variant_scores,
        parquet=directory(RUN.variant_scores_parquet),
    log:
        RUN.log("variants"),
    conda:
        "../../envs/esmshard.yaml"
    resources:
        runtime=io_runtime,
    params:
        variants=config["variants"],
        strategies=config["variant_scoring"],
    script:
        "../scripts/variants.py"
