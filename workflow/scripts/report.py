from esmshard.report import write_report
from esmshard.steps import run_step

run_step(
    snakemake.log[0],
    write_report,
    metric_files=list(snakemake.input.metrics),
    telemetry_files=list(snakemake.input.telemetry),
    out_json=snakemake.output.json,
    out_html=snakemake.output.html,
    run_json=snakemake.input.run,
)
