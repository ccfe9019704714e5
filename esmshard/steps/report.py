"""The scaling report: how well the run used its devices, from the shards' metrics
(report_scaling), drawn (report_plots) and written as a page (report_html) and files.
"""

import csv
import json
import os
from pathlib import Path

from ..files import atomic_path, write_json, write_text
from ..version import __version__
from .report_html import (
    DEVICE_COLUMNS,
    HEADINGS,
    NOTHING_COMPUTED,
    SHARD_COLUMNS,
    SPEEDUP_COLUMNS,
    TITLE,
    computed_with_section,
    device_rows,
    mutants_section,
    neighbours_section,
    render_html,
    speedup_rows,
    table_rows,
)
from .report_plots import figures
from .report_scaling import (
    load_metrics,
    mutants_summary,
    neighbours_summary,
    read_telemetry,
    scaling,
    step_seconds,
)


def write_figures(folder, shown: dict[str, bytes], result: dict) -> None:
    """The report's plots and tables as files, for Snakemake's report (`snakemake --report`)."""
    with atomic_path(folder) as tmp:
        Path(tmp).mkdir()
        for name, png in shown.items():
            (Path(tmp) / f"{name}.png").write_bytes(png)
        tables = {
            "speedup": (speedup_rows(result), SPEEDUP_COLUMNS),
            "devices": (device_rows(result), DEVICE_COLUMNS),
            "shards": (result["shards"], SHARD_COLUMNS),
        }
        for name, (rows, columns) in tables.items():
            with open(Path(tmp) / f"{name}.tsv", "w", newline="") as fh:
                writer = csv.writer(fh, delimiter="\t", lineterminator="\n")
                writer.writerow([HEADINGS[c] for c in columns])
                writer.writerows(table_rows(rows, columns))


def write_report(
    metric_files,
    telemetry_files,
    out_json,
    out_html,
    run_json=None,
    out_figures=None,
    mutant_metric_files=(),
    mutants_run_json=None,
    neighbour_metric_files=(),
) -> dict:
    """The scaling report of a run's embed jobs (and of its mutants' run, `mutants_run_json`
    and its jobs' metrics, where `pseudo_ppl` or `pllr` made one, and of its `neighbours`
    search jobs)."""
    run = json.loads(Path(run_json).read_text()) if run_json else {}
    computed_with = computed_with_section(run) if run else ""
    metrics = load_metrics(metric_files)
    mutants = mutants_summary(mutant_metric_files, mutants_run_json)
    neighbours = neighbours_summary(neighbour_metric_files)
    if not metrics:  # every sequence came from the store: no job to report on
        result = {
            "n_shards": 0,
            "n_sequences": 0,
            "note": NOTHING_COMPUTED,
            "esmshard_version": __version__,
            "mutants": mutants,
            "neighbours": neighbours,
        }
        write_json(out_json, result)
        sections = mutants_section(mutants) + neighbours_section(neighbours) + computed_with
        write_text(
            out_html,
            f"<!doctype html><html><body><h1>{TITLE}</h1>"
            f"<p>{NOTHING_COMPUTED}</p>{sections}</body></html>\n",
        )
        if out_figures:
            with atomic_path(out_figures) as tmp:
                Path(tmp).mkdir()
        return result
    result = {**scaling(metrics), "made_by": run.get("made_by"), "esmshard_version": __version__}
    result["mutants"], result["neighbours"] = mutants, neighbours
    if run_json:
        result["step_seconds"] = step_seconds(run_json)
    write_json(out_json, result)
    shown = figures(result, read_telemetry(metrics, telemetry_files))
    if out_figures:
        write_figures(out_figures, shown, result)
    tables = (
        os.path.relpath(Path(out_figures) / "shards.tsv", Path(out_html).parent)
        if out_figures
        else None
    )
    write_text(out_html, render_html(result, shown, run, computed_with, tables))
    return result
