from esmshard import run_step
from esmshard.report import write_report

run_step(
    snakemake.log[0],
    write_report,
    metric_files=list(snakemake.input),
    out_json=snakemake.output.json,
    out_html=snakemake.output.html,
)
