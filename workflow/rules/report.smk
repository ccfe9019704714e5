rule report:
    input:
        metrics=lambda wildcards: [RUN.metrics(shard) for shard in planned_shards()],
        telemetry=lambda wildcards: [RUN.telemetry(shard) for shard in planned_shards()],
        run=RUN.run_json,
        # `pseudo_ppl`, `pllr`: the mutants' run, reported beside the records'
        mutant_metrics=lambda wildcards: (
            [MUTANTS.metrics(s) for s in planned_shards(None, "shard_mutants", MUTANTS)]
            if MUTANTS_WANTED
            else []
        ),
        mutants_run=[MUTANTS.run_json] if MUTANTS_WANTED else [],
        # `neighbours`: its search jobs' figures
        neighbour_metrics=lambda wildcards: (
            [RUN.neighbour_metrics(part) for part in neighbour_parts()]
            if config["neighbours"]
            else []
        ),
    output:
        json=RUN.scaling_json,
        html=report(
            RUN.scaling_html,
            caption="../report/scaling_report.rst",
            category="Scaling",
            labels={"page": "scaling report"},
        ),
        figures=report(
            directory(RUN.report_figures),
            patterns=["{name}.png", "{name}.tsv"],
            caption="../report/figures.rst",
            category="Scaling",
            labels={"figure": "{name}"},
        ),
    log:
        RUN.log("report"),
    conda:
        "../../envs/esmshard.yaml"
    script:
        "../scripts/report.py"
