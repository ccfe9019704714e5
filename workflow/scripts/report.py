from esmshard.steps.job import run_step

run_step(
    snakemake.log[0],
    "esmshard.steps.report:write_report",
    metric_files=list(snakemake.input.metrics),
    telemetry_files=list(snakemake.input.telemetry),
    out_json=snakemake.output.json,
    out_html=snakemake.output.html,
    run_json=snakemake.input.run,
    out_figures=snakemake.output.figures,
    mutant_metric_files=list(snakemake.input.mutant_metrics),
    mutants_run_json=snakemake.input.mutants_run[0] if snakemake.input.mutants_run else None,
    neighbour_metric_files=list(snakemake.input.neighbour_metrics),
)
