rule report:
    input:
        expand(f"{OUT}/metrics/{{shard}}.json", shard=SHARDS),
    output:
        json=SCALING_JSON,
        html=SCALING_HTML,
    log:
        f"{OUT}/logs/report.log",
    conda:
        "../../envs/esmshard.yaml"
    script:
        "../scripts/report.py"
