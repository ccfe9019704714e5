rule report:
    input:
        metrics=expand(RUN.metrics("{shard}"), shard=SHARDS),
        telemetry=expand(RUN.telemetry("{shard}"), shard=SHARDS),
    output:
        json=RUN.scaling_json,
        html=RUN.scaling_html,
    log:
        RUN.log("report"),
    conda:
        "../../envs/esmshard.yaml"
    script:
        "../scripts/report.py"
