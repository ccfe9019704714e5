rule report:
    input:
        metrics=lambda wildcards: [RUN.metrics(shard) for shard in planned_shards()],
        telemetry=lambda wildcards: [RUN.telemetry(shard) for shard in planned_shards()],
        run=RUN.run_json,
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
