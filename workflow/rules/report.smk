rule report:
    input:
        metrics=lambda wildcards: [RUN.metrics(shard) for shard in planned_shards()],
        telemetry=lambda wildcards: [RUN.telemetry(shard) for shard in planned_shards()],
        run=RUN.run_json,
    output:
        json=RUN.scaling_json,
        html=RUN.scaling_html,
    log:
        RUN.log("report"),
    conda:
        "../../envs/esmshard.yaml"
    script:
        "../scripts/report.py"
