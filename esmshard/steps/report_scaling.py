"""Measure how well a run used its devices, from its jobs' metrics: each slot's work and time,
the makespan, and the speedup that 1, 2, 4 and 8 devices would give (a replay of the
shards' times).
"""

import csv
import heapq
import json
import re
from pathlib import Path

from ..layout import Layout, NeighbourPart
from .progress import (
    busy_seconds,
    computed_residues,
    computing_span,
    per_slot,
    read_metrics,
    slot_key,
    stopped_span,
    valid_stopped,
)

MODELLED_GPUS = (1, 2, 4, 8)
# Speedups that multi-GPU guides promise for data-parallel inference.
GUIDE_SPEEDUP = {2: (1.8, 2.0), 4: (3.5, 4.0), 8: (7.0, 8.0)}


def load_metrics(paths) -> list[dict]:
    return sorted(map(read_metrics, paths), key=lambda m: (m["started_at"], m["shard"]))


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
    """Measure the run's use of its devices from its jobs' `metrics`: the report's numbers."""
    start = min(m["started_at"] for m in metrics)
    wall = max(m["finished_at"] for m in metrics) - start
    durations = [m["seconds"] for m in metrics]
    busy = sum(durations)
    residues = sum(m["n_residues"] for m in metrics)
    computed = sum(computed_residues(m) for m in metrics)  # by these jobs: their speed
    tokens = sum(m.get("forward_tokens", 0) for m in metrics)
    slots = sorted({slot_key(m) for m in metrics})
    # the time any embed job computed: jobs side by side count once, the time between two
    # commands of the run (a stop, then the same command) not at all; the rates are over it
    spans = [computing_span(m, m["finished_at"]) for m in metrics]
    ran = busy_seconds(spans)
    # and the jobs stopped before them (their kept pieces are in these jobs' parts)
    stopped = [job for m in metrics for job in valid_stopped(m.get("stopped_jobs"))]
    with_stopped = busy_seconds(spans + [stopped_span(job) for job in stopped])
    measured = busy / wall if wall > 0 else None
    modelled = modelled_speedups(durations, measured, len(slots))
    slot_rows = devices(metrics)
    return {
        "model": metrics[0]["model"],
        "weights": metrics[0]["weights"],
        "n_shards": len(metrics),
        "n_sequences": sum(m["n_sequences"] for m in metrics),
        "n_residues": residues,
        # kept by earlier, stopped jobs of the shards (esmshard.store.pieces): done, not timed
        "n_residues_kept": residues - computed,
        "n_failed": sum(m.get("n_failed", 0) for m in metrics),
        "wall_seconds": wall,
        "busy_seconds": busy,
        "jobs_seconds": with_stopped,
        "stopped_jobs": len(stopped),
        # one rate, as `esmshard status` counts it: the finished jobs' work over their time
        "residues_per_second": computed / ran if ran > 0 else None,
        # every forward pass's tokens (masked marginals: a pass per residue), by the finished
        # jobs over their own time (a stopped job's tokens are not counted)
        "forward_tokens": tokens,
        "forward_tokens_per_second": tokens / ran if ran > 0 and tokens else None,
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
        "shards": shard_rows(metrics, start),
    }


def modelled_speedups(durations: list[float], measured: float | None, n_slots: int) -> list:
    """The makespan, speedup and efficiency that each of MODELLED_GPUS devices would give the
    shards' `durations`, beside the `measured` speedup where the run had `n_slots` of them."""
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
                # a measured figure only where the run had that many slots
                "measured_speedup": measured if k == n_slots else None,
            }
        )
    return modelled


def shard_rows(metrics: list[dict], start: float) -> list[dict]:
    """Each shard's row of the report: its slot, times, work and rate, from `start` on."""
    return [
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
            "n_residues_kept": m["n_residues"] - computed_residues(m),
            "residues_per_second": computed_residues(m) / m["compute_seconds"]
            if m["compute_seconds"] > 0
            else None,
            "started_offset": m["started_at"] - start,
            "slot": slot_key(m),
        }
        for m in metrics
    ]


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


# The line each step's job logs as it ends (esmshard.steps.job.run_step).
STEP_DONE = re.compile(r": done in ([\d.]+) s, peak memory")


def step_seconds(run_json) -> dict[str, float | None]:
    """The shard and merge steps' own time, by their logs beside run.json (the latest run of
    each; None where a log says none)."""
    layout = Layout(str(Path(run_json).parent))
    found = {}
    for step in ("shard", "merge"):
        try:
            times = STEP_DONE.findall(Path(layout.log(step)).read_text(errors="replace"))
        except OSError:
            times = []
        found[step] = float(times[-1]) if times else None
    return found


def mutants_summary(metric_files, run_json) -> dict | None:
    """The mutants' run of `pseudo_ppl` and `pllr` (its own shards, under the outdir's mutants/):
    what it computed and in what time; None without one."""
    if not run_json:
        return None
    run = json.loads(Path(run_json).read_text())
    metrics = load_metrics(metric_files)
    found = {"outdir": str(Path(run_json).parent), "sequences": run.get("records", 0),
             "computed": run.get("computed", 0), "from_store": run.get("from_store", 0),
             "planned_at": run.get("planned_at"), "finished_at": run.get("finished_at")}  # fmt: skip
    if metrics:
        mutants = scaling(metrics)
        found |= {key: mutants[key] for key in ("n_shards", "jobs_seconds", "forward_tokens",
                                                 "forward_tokens_per_second", "n_failed")}  # fmt: skip
    return found


def neighbours_summary(metric_files) -> dict | None:
    """The `neighbours` search jobs' figures (esmshard.steps.neighbours), or None without them."""
    parts = [json.loads(Path(path).read_text()) for path in metric_files]
    if not parts:
        return None
    rows, seconds = sum(p["reference_rows"] for p in parts), sum(p["seconds"] for p in parts)
    asked = ("reference", "k", "metric", "layer", "command")
    last = max(parts, key=lambda p: p.get("finished_at", 0))
    return {
        "jobs": len(parts), "reference_rows": rows, "queries": parts[0]["queries"],
        "seconds": seconds, "rows_per_second": rows / max(seconds, 1e-9),
        # parts written before the search's settings were recorded have none
        "search": {**{key: last.get(key) for key in asked}, "finished_at": last.get("finished_at")}
        if "k" in last else None,
        "parts": sorted(parts, key=lambda p: NeighbourPart.named(p["part"]).index),
    }  # fmt: skip
