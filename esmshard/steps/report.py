"""The scaling report: how well the run used its devices, from the shards' metrics."""

import base64
import csv
import heapq
import html
import io
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from ..files import write_json, write_text  # noqa: E402
from ..version import __version__  # noqa: E402
from .progress import per_slot, slot_key  # noqa: E402
from .provenance import COMPUTED_WITH, mixed_precisions  # noqa: E402

MODELLED_GPUS = (1, 2, 4, 8)
TITLE = f"esmshard {__version__} scaling report"
NOTHING_COMPUTED = "This run computed nothing: the store held every sequence."
LABELLED_SHARDS = 64  # plots name each shard up to this many
# Speedups that multi-GPU guides promise for data-parallel inference.
GUIDE_SPEEDUP = {2: (1.8, 2.0), 4: (3.5, 4.0), 8: (7.0, 8.0)}


def load_metrics(paths) -> list[dict]:
    return sorted(
        (json.loads(Path(p).read_text()) for p in paths),
        key=lambda m: (m["started_at"], m["shard"]),
    )


def replay(durations: list[float], n_devices: int) -> float:
    """Makespan of running the shards, in the given order, each on the first device to free up."""
    free_at = [0.0] * n_devices
    for seconds in durations:
        heapq.heappush(free_at, heapq.heappop(free_at) + seconds)
    return max(free_at)


def devices(metrics: list[dict]) -> list[dict]:
    """One entry per device slot: what NVML saw while its shards ran, its throughput, its busy
    time, and its idle tail: how long it waited, after its last shard, for the run's last one."""
    out = []
    end = max(m["finished_at"] for m in metrics)
    for key, s in per_slot(metrics).items():
        ran = [m for m in metrics if slot_key(m) == key]

        def weighted(field):
            pairs = [(m[field], m["telemetry_samples"]) for m in ran if m.get(field) is not None]
            n = sum(w for _, w in pairs)
            return sum(v * w for v, w in pairs) / n if n else None

        out.append(
            {
                "slot": key,
                "device": s["device"],
                "name": s["device_name"],
                "memory_total_bytes": s["memory_total_bytes"],
                "mean_memory_used_bytes": weighted("mean_memory_used_bytes"),
                "peak_memory_used_bytes": s["peak_memory_used_bytes"],
                "mean_utilization_percent": weighted("mean_utilization_percent"),
                "shards": s["shards"],
                "residues_per_second": s["residues_per_second"],
                "busy_seconds": sum(m["seconds"] for m in ran),
                "idle_tail_seconds": end - max(m["finished_at"] for m in ran),
            }
        )
    return out


def scaling(metrics: list[dict]) -> dict:
    start = min(m["started_at"] for m in metrics)
    wall = max(m["finished_at"] for m in metrics) - start
    durations = [m["seconds"] for m in metrics]
    busy = sum(durations)
    residues = sum(m["n_residues"] for m in metrics)
    slots = sorted({slot_key(m) for m in metrics})
    one_device = replay(durations, 1)
    modelled = []
    for k in MODELLED_GPUS:
        makespan = replay(durations, k)
        speedup = one_device / makespan
        modelled.append(
            {
                "gpus": k,
                "modelled_makespan_seconds": makespan,
                "modelled_speedup": speedup,
                "modelled_efficiency": speedup / k,
                "guide_speedup": list(GUIDE_SPEEDUP.get(k, (1.0, 1.0))),
            }
        )
    measured = busy / wall if wall > 0 else None
    for row in modelled:  # a measured figure only where the run had that many slots
        row["measured_speedup"] = measured if row["gpus"] == len(slots) else None
    slot_rows = devices(metrics)
    return {
        "model": metrics[0]["model"],
        "weights": metrics[0]["weights"],
        "n_shards": len(metrics),
        "n_sequences": sum(m["n_sequences"] for m in metrics),
        "n_residues": residues,
        "n_failed": sum(m.get("n_failed", 0) for m in metrics),
        "wall_seconds": wall,
        "busy_seconds": busy,
        "residues_per_second": residues / wall if wall > 0 else None,
        "load_imbalance": max(durations) / (busy / len(durations)) if busy > 0 else None,
        # compiled layers (`compile`): seconds spent compiling, and the shards whose compiled
        # code came from the store's cache
        "compile_seconds": sum(m.get("compile_seconds", 0.0) for m in metrics),
        "compile_cache_hits": sum(m.get("compile_cache") == "hit" for m in metrics),
        "slots": slots,
        "measured": {
            "gpus": len(slots),
            "speedup": measured,
            "efficiency": measured / len(slots) if measured is not None else None,
        },
        "modelled": modelled,
        "devices": slot_rows,
        # the time the first slot to run out of shards waits for the last shard
        "idle_tail_seconds": max(d["idle_tail_seconds"] for d in slot_rows),
        "telemetry": any(m.get("telemetry_samples") for m in metrics),
        "shards": [
            {
                k: m[k]
                for k in (
                    "shard",
                    "gpu_slot",
                    "device",
                    "started_at",
                    "finished_at",
                    "seconds",
                    "n_sequences",
                    "n_residues",
                    "load_seconds",
                )
            }
            | {
                "compile_seconds": m.get("compile_seconds", 0.0),
                "compile_cache": m.get("compile_cache", "off"),
                "residues_per_second": m["n_residues"] / m["seconds"]
                if m["seconds"] > 0
                else None,
                "started_offset": m["started_at"] - start,
                "slot": slot_key(m),
            }
            for m in metrics
        ],
    }


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def _timeline(result) -> str:
    slots = result["slots"]
    labelled = len(result["shards"]) <= LABELLED_SHARDS
    fig, ax = plt.subplots(figsize=(9, 0.6 * len(slots) + 1.5))
    for y, slot in enumerate(slots):  # one artist per slot: thousands of shards draw in seconds
        ran = [s for s in result["shards"] if s["slot"] == slot]
        spans = [(s["started_offset"], s["seconds"]) for s in ran]
        ax.broken_barh(spans, (y - 0.4, 0.8), edgecolor="black" if labelled else "none")
        for shard in ran if labelled else []:
            ax.text(
                shard["started_offset"] + shard["seconds"] / 2,
                y,
                shard["shard"].split("_")[-1],
                ha="center",
                va="center",
                fontsize=7,
            )
    ax.set_yticks(range(len(slots)), slots)
    ax.set_xlabel("seconds since the first shard started")
    ax.set_title("Shard jobs per device slot")
    return _png(fig)


def _throughput(result) -> str:
    shards = result["shards"]
    fig, ax = plt.subplots(figsize=(9, 3))
    ax.bar(range(len(shards)), [s["residues_per_second"] or 0 for s in shards])
    if len(shards) <= LABELLED_SHARDS:
        ax.set_xticks(range(len(shards)), [s["shard"].split("_")[-1] for s in shards], fontsize=7)
    ax.set_xlabel("shard (in start order)")
    ax.set_ylabel("residues / s")
    ax.set_title("Throughput per shard")
    return _png(fig)


def _speedup(result) -> str:
    gpus = [m["gpus"] for m in result["modelled"]]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(gpus, gpus, "k:", label="ideal")
    ax.fill_between(
        gpus,
        [m["guide_speedup"][0] for m in result["modelled"]],
        [m["guide_speedup"][1] for m in result["modelled"]],
        alpha=0.2,
        label="guides' promise",
    )
    ax.plot(
        gpus,
        [m["modelled_speedup"] for m in result["modelled"]],
        "o-",
        label="modelled from this run's shards",
    )
    if result["measured"]["speedup"]:
        ax.plot(
            [result["measured"]["gpus"]],
            [result["measured"]["speedup"]],
            "r*",
            ms=14,
            label="measured",
        )
    ax.set_xlabel("GPUs")
    ax.set_ylabel("speedup")
    ax.set_xticks(gpus)
    ax.legend()
    ax.set_title("Speedup")
    return _png(fig)


def read_telemetry(metrics: list[dict], telemetry_files) -> dict[str, list[dict]]:
    """Telemetry samples per device slot, from each shard's `telemetry/<shard>.tsv`."""
    series = {}
    file_of = {Path(path).stem: path for path in telemetry_files}
    for m in metrics:
        with open(file_of[m["shard"]], newline="") as fh:
            rows = [
                {k: float(v) if v else None for k, v in row.items()}
                for row in csv.DictReader(fh, delimiter="\t")
            ]
        if rows:  # header only: NVML was not available to that job
            series.setdefault(slot_key(m), []).extend(rows)
    return {k: sorted(v, key=lambda r: r["time"]) for k, v in series.items()}


def _device_plots(result, series) -> str:
    start = min(s["started_at"] for s in result["shards"])
    fig, (util, memory) = plt.subplots(2, 1, figsize=(9, 5), sharex=True)
    for key, rows in sorted(series.items()):
        t = [r["time"] - start for r in rows]
        util.plot(t, [r["utilization_percent"] for r in rows], ".-", ms=3, label=f"slot {key}")
        memory.plot(
            t,
            [
                r["memory_used_bytes"] / (1 << 30) if r["memory_used_bytes"] is not None else None
                for r in rows
            ],
            ".-",
            ms=3,
            label=f"slot {key}",
        )
    util.set_ylabel("GPU utilization (%)")
    util.set_ylim(0, 105)
    memory.set_ylabel("memory used (GiB)")
    memory.set_xlabel("seconds since the first shard started")
    util.legend(fontsize=7)
    util.set_title("Devices over time (NVML, one sample per second)")
    return _png(fig)


def _table(rows, columns) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(_fmt(r[c]))}</td>" for c in columns) + "</tr>"
        for r in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def _gib(value):
    return value / (1 << 30) if value is not None else None


def _fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:,.2f}"
    if isinstance(value, list):
        return "–".join(_fmt(v) for v in value)
    return "–" if value is None else str(value)


def render_html(result: dict, series: dict, computed_with: str = "") -> str:
    warning = ""
    if result["weights"] == "random":
        warning = "<p class=warn>Random-weight model: these embeddings are for testing and benchmarking only.</p>"
    summary = [
        {"figure": "model", "value": f"{result['model']} ({result['weights']} weights)"},
        {"figure": "shards", "value": result["n_shards"]},
        {
            "figure": "sequences / residues",
            "value": f"{result['n_sequences']:,} / {result['n_residues']:,}",
        },
        {"figure": "failed sequences", "value": result["n_failed"]},
        {"figure": "wall time of the embed jobs (s)", "value": result["wall_seconds"]},
        {"figure": "residues/s overall", "value": result["residues_per_second"]},
        {"figure": "load imbalance (slowest shard / mean)", "value": result["load_imbalance"]},
        {
            "figure": "idle tail (s): the first slot out of shards waits for the last shard",
            "value": result["idle_tail_seconds"],
        },
        {
            "figure": "compiling (s; shards whose compiled code was in the store)",
            "value": f"{_fmt(result['compile_seconds'])}; {result['compile_cache_hits']} of "
            f"{result['n_shards']}",
        },
        {
            "figure": "measured speedup on this run's slots",
            "value": f"{_fmt(result['measured']['speedup'])}× on {result['measured']['gpus']} slot(s)",
        },
    ]
    images = "".join(
        f'<img src="data:image/png;base64,{png}">'
        for png in (_timeline(result), _throughput(result), _speedup(result))
    )
    if series:
        device_section = f'<img src="data:image/png;base64,{_device_plots(result, series)}">'
    else:
        device_section = "<p>No GPU telemetry: NVML was not available to the jobs.</p>"
    device_rows = [
        {
            **d,
            "memory_total_GiB": _gib(d["memory_total_bytes"]),
            "mean_memory_used_GiB": _gib(d["mean_memory_used_bytes"]),
            "peak_memory_used_GiB": _gib(d["peak_memory_used_bytes"]),
        }
        for d in result["devices"]
    ]
    return f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>{TITLE}</title>
<style>body{{font-family:sans-serif;max-width:1000px;margin:auto}}table{{border-collapse:collapse;margin:1em 0}}
td,th{{border:1px solid #ccc;padding:3px 8px;text-align:right}}.warn{{color:#a00;font-weight:bold}}img{{display:block;margin:1em 0}}</style>
</head><body><h1>{TITLE}</h1>{warning}
{_table(summary, ["figure", "value"])}
<h2>Speedup and efficiency</h2>
<p>Modelled: by replaying the measured shard times, in their start order, on that many devices. Measured: this run's own, on its
{len(result["slots"])} slot(s) (busy time of the jobs over their wall time); none for the
other device counts, which this run did not have.</p>
{
        _table(
            result["modelled"],
            [
                "gpus",
                "modelled_makespan_seconds",
                "modelled_speedup",
                "modelled_efficiency",
                "measured_speedup",
                "guide_speedup",
            ],
        )
    }
{images}
<h2>Devices</h2>
{
        _table(
            device_rows,
            [
                "slot",
                "device",
                "name",
                "shards",
                "residues_per_second",
                "busy_seconds",
                "idle_tail_seconds",
                "mean_utilization_percent",
                "mean_memory_used_GiB",
                "peak_memory_used_GiB",
                "memory_total_GiB",
            ],
        )
    }
{device_section}
<h2>Shards</h2>
{
        _table(
            result["shards"],
            [
                "shard",
                "slot",
                "device",
                "started_offset",
                "seconds",
                "load_seconds",
                "compile_seconds",
                "compile_cache",
                "n_sequences",
                "n_residues",
                "residues_per_second",
            ],
        )
    }
{computed_with}
</body></html>
"""


def computed_with_section(run: dict) -> str:
    """What computed the run's embeddings (the store's parts included), and a warning where
    they mix precisions."""
    rows = run.get("computed_with", [])
    mixed = mixed_precisions(rows)
    warning = f"<p class=warn>{html.escape(mixed[0].upper() + mixed[1:])}.</p>" if mixed else ""
    made_by = [{"what": name, "value": value} for name, value in run.get("made_by", {}).items()]
    return (
        "<h2>Computed with</h2>"
        + _table(made_by, ["what", "value"])
        + warning
        + _table(rows, [*COMPUTED_WITH, "parts"])
    )


def write_report(metric_files, telemetry_files, out_json, out_html, run_json=None) -> dict:
    run = json.loads(Path(run_json).read_text()) if run_json else {}
    computed_with = computed_with_section(run) if run else ""
    metrics = load_metrics(metric_files)
    if not metrics:  # every sequence came from the store: no job to report on
        result = {
            "n_shards": 0,
            "n_sequences": 0,
            "note": NOTHING_COMPUTED,
            "esmshard_version": __version__,
        }
        write_json(out_json, result)
        write_text(
            out_html,
            f"<!doctype html><html><body><h1>{TITLE}</h1>"
            f"<p>{NOTHING_COMPUTED}</p>{computed_with}</body></html>\n",
        )
        return result
    result = {**scaling(metrics), "made_by": run.get("made_by"), "esmshard_version": __version__}
    write_json(out_json, result)
    write_text(
        out_html, render_html(result, read_telemetry(metrics, telemetry_files), computed_with)
    )
    return result
