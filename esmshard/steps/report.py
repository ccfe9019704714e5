"""The scaling report: how well the run used its devices, from the shards' metrics."""

import base64
import csv
import heapq
import html
import io
import json
import os
import re
import time
from pathlib import Path

# Figures made directly, not through pyplot: no GUI backend chosen, no figures held
# globally, and a third less to import in each report job.
from matplotlib.figure import Figure

from ..files import atomic_path, write_json, write_text
from ..layout import Layout
from ..models import FAMILIES
from ..version import __version__
from .progress import (
    busy_seconds,
    computed_residues,
    computing_span,
    duration,
    per_slot,
    rate,
    read_metrics,
    slot_key,
    stopped_span,
    valid_stopped,
)
from .provenance import COMPUTED_WITH, mixed_precisions

MODELLED_GPUS = (1, 2, 4, 8)
TITLE = f"esmshard {__version__} scaling report"
NOTHING_COMPUTED = "This run computed nothing: the store held every sequence."
LABELLED_SHARDS = 64  # plots name each shard up to this many
# The Shards table lists the slowest this many (every shard is in scaling.json and shards.tsv),
# so that a run of thousands of shards stays a page a browser shows at once.
LISTED_SHARDS = 100
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
    start = min(m["started_at"] for m in metrics)
    wall = max(m["finished_at"] for m in metrics) - start
    durations = [m["seconds"] for m in metrics]
    busy = sum(durations)
    residues = sum(m["n_residues"] for m in metrics)
    computed = sum(computed_residues(m) for m in metrics)  # by these jobs: their speed
    tokens = sum(m.get("forward_tokens", 0) for m in metrics)
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
    # the time any embed job computed: jobs side by side count once, the time between two
    # commands of the run (a stop, then the same command) not at all; the rates are over it
    spans = [computing_span(m, m["finished_at"]) for m in metrics]
    ran = busy_seconds(spans)
    # and the jobs stopped before them (their kept pieces are in these jobs' parts)
    stopped = [job for m in metrics for job in valid_stopped(m.get("stopped_jobs"))]
    with_stopped = busy_seconds(spans + [stopped_span(job) for job in stopped])
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
                "n_residues_kept": m["n_residues"] - computed_residues(m),
                "residues_per_second": computed_residues(m) / m["compute_seconds"]
                if m["compute_seconds"] > 0
                else None,
                "started_offset": m["started_at"] - start,
                "slot": slot_key(m),
            }
            for m in metrics
        ],
    }


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    return buf.getvalue()


def _timeline(result) -> bytes:
    slots = result["slots"]
    labelled = len(result["shards"]) <= LABELLED_SHARDS
    fig = Figure(figsize=(9, 0.6 * len(slots) + 1.5))
    ax = fig.subplots()
    for y, slot in enumerate(slots):  # one artist per slot: thousands of shards draw in seconds
        ran = [s for s in result["shards"] if s["slot"] == slot]
        spans = [(s["started_offset"], s["seconds"]) for s in ran]
        ax.broken_barh(spans, (y - 0.4, 0.8), edgecolor="black" if labelled else "none")
        for shard in ran if labelled else []:
            ax.text(
                shard["started_offset"] + shard["seconds"] / 2,
                y,
                shard["shard"].split("-")[-1],
                ha="center",
                va="center",
                fontsize=10,
            )
    ax.set_yticks(range(len(slots)), slots)
    ax.set_xlabel("seconds since the first shard started")
    ax.set_title("Shard jobs per device slot")
    return _png(fig)


def _throughput(result) -> bytes:
    shards = result["shards"]
    fig = Figure(figsize=(9, 3))
    ax = fig.subplots()
    ax.bar(range(len(shards)), [s["residues_per_second"] or 0 for s in shards])
    if len(shards) <= LABELLED_SHARDS:
        ax.set_xticks(range(len(shards)), [s["shard"].split("-")[-1] for s in shards], fontsize=7)
    ax.set_xlabel("shard (in start order)")
    ax.set_ylabel("residues / s")
    ax.set_title("Throughput per shard")
    return _png(fig)


def _speedup(result) -> bytes:
    gpus = [m["gpus"] for m in result["modelled"]]
    fig = Figure(figsize=(6, 4))
    ax = fig.subplots()
    ax.plot(gpus, gpus, "k:", label="ideal")
    ax.fill_between(
        gpus,
        [m["guide_speedup"][0] for m in result["modelled"]],
        [m["guide_speedup"][1] for m in result["modelled"]],
        alpha=0.2,
        label="guides' range (87.5-100% of ideal)",
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


def _device_plots(result, series) -> bytes:
    start = min(s["started_at"] for s in result["shards"])
    fig = Figure(figsize=(9, 5))
    util, memory = fig.subplots(2, 1, sharex=True)
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


# Each table column's heading, with its unit: one place for every table of the report.
HEADINGS = {
    "gpus": "GPUs",
    "modelled_makespan_seconds": "modelled time (s)",
    "modelled_speedup": "modelled speedup (×)",
    "modelled_efficiency_percent": "modelled efficiency (% of ideal)",
    "measured_speedup": "measured on this run (×)",
    "guide_speedup": "guides' range (×)",
    "slot": "slot",
    "device": "device",
    "name": "GPU",
    "shards": "shards",
    "residues_per_second": "residues/s",
    "busy_seconds": "busy (s)",
    "idle_tail_seconds": "idle at the end (s)",
    "mean_utilization_percent": "mean utilization (%)",
    "mean_memory_used_GiB": "mean memory used (GiB)",
    "peak_memory_used_GiB": "peak memory used (GiB)",
    "memory_total_GiB": "memory (GiB)",
    "shard": "shard",
    "started_offset": "started at (s)",
    "seconds": "time (s)",
    "load_seconds": "loading (s)",
    "compile_seconds": "compiling (s)",
    "compile_cache": "compiled code",
    "n_sequences": "sequences",
    "n_residues": "residues",
    "n_residues_kept": "of them kept by stopped jobs",
    "what": "what",
    "value": "value",
    "parts": "parts",
}
SPEEDUP_COLUMNS = ["gpus", "modelled_makespan_seconds", "modelled_speedup",
                   "modelled_efficiency_percent", "measured_speedup", "guide_speedup"]  # fmt: skip
DEVICE_COLUMNS = ["slot", "device", "name", "shards", "residues_per_second", "busy_seconds",
                  "idle_tail_seconds", "mean_utilization_percent", "mean_memory_used_GiB",
                  "peak_memory_used_GiB", "memory_total_GiB"]  # fmt: skip
SHARD_COLUMNS = ["shard", "slot", "device", "started_offset", "seconds", "load_seconds",
                 "compile_seconds", "compile_cache", "n_sequences", "n_residues",
                 "n_residues_kept", "residues_per_second"]  # fmt: skip
STYLE = """body{font-family:sans-serif;max-width:1180px;margin:auto;padding:0 16px;line-height:1.4}
.wide{overflow-x:auto;max-width:100%;margin:1em 0}table{border-collapse:collapse}
td,th{border:1px solid #ccc;padding:3px 8px;text-align:right;white-space:nowrap}
th{background:#f3f3f3;white-space:normal;min-width:4em}td.label{text-align:left;white-space:normal}
p.text{word-break:break-all}
td.text{text-align:left;white-space:normal;word-break:break-all}
.warn{color:#a00;font-weight:bold}img{display:block;margin:1em 0;max-width:100%;height:auto}"""


def _table(rows, columns, text=(), labels=()) -> str:
    """A table in a box of its own that scrolls sideways where the page is too narrow; the
    columns in `labels` hold words, and those in `text` long strings that may break anywhere (a
    command, a path): both wrap and align left."""

    def cell(row, column):
        kind = " class=text" if column in text else " class=label" if column in labels else ""
        return f"<td{kind}>{html.escape(_fmt(row[column])).replace(chr(10), '<br>')}</td>"

    head = "".join(f"<th>{html.escape(HEADINGS.get(c, c))}</th>" for c in columns)
    body = "".join("<tr>" + "".join(cell(r, c) for c in columns) + "</tr>" for r in rows)
    return f"<div class=wide><table><tr>{head}</tr>{body}</table></div>"


def table_rows(rows, columns) -> list[list[str]]:
    """A table's rows as text, as the report's TSV files hold them."""
    return [[_fmt(r[c]) for c in columns] for r in rows]


def _gib(value):
    return value / (1 << 30) if value is not None else None


def _fmt(value) -> str:
    """A cell as people read it: a float to the digits that mean something (351.41 -> 351)."""
    if isinstance(value, float):
        digits = 0 if abs(value) >= 100 else 1 if abs(value) >= 10 else 2
        return f"{value:,.{digits}f}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    if isinstance(value, list):
        return "–".join(_fmt(v) for v in value)
    return "–" if value is None else str(value)


def _when(seconds) -> str:
    """A moment with its time zone (the machine's), and its offset from UTC where that is not
    UTC itself."""
    if not seconds:
        return "–"
    moment = time.localtime(seconds)
    zone = time.strftime("%Z", moment)
    offset = "" if zone == "UTC" else time.strftime(" (UTC%z)", moment)
    return time.strftime("%Y-%m-%d %H:%M:%S ", moment) + zone + offset


def measured_sentence(measured: dict) -> str:
    """The run's own speedup, said in words (a speedup below 1 on one slot is no slowdown)."""
    k, speedup = measured["gpus"], measured["speedup"]
    if speedup is None:
        return "Measured on this run: nothing (its shards took no time)."
    if k == 1:
        return (
            f"Measured on this run: its one slot was busy computing shards {speedup:.0%} of the "
            "time from the first shard's start to the last shard's end (the rest went to "
            "starting jobs between shards)."
        )
    return (
        f"Measured on this run: its {k} slots together finished the shards {speedup:.2f}× as "
        f"fast as one slot running them back to back would, {speedup / k:.0%} of the ideal {k}×."
    )


def cap_sentence(result: dict) -> str:
    """Where the shard count, or the longest shard, caps the modelled speedup."""
    durations = [s["seconds"] for s in result["shards"]]
    longest = max(durations)
    cap = sum(durations) / longest if longest > 0 else 1.0
    n, most = result["n_shards"], max(MODELLED_GPUS)
    if n < most:
        return (
            f"This run had {n} shard{'s' if n > 1 else ''}: on more than {n} GPU"
            f"{'s' if n > 1 else ''} the others would have nothing to do, so the modelled "
            f"speedup stops at {cap:.2f}× (all the work over the longest shard). More shards "
            "(`shards: N`; `auto` plans at least one per GPU of the pool) let more GPUs help."
        )
    if cap < 0.875 * most:
        return (
            f"The longest shard caps the modelled speedup at {cap:.2f}× (all the work over the "
            "longest shard): more, smaller shards would let more GPUs help."
        )
    return ""


GUIDES_SENTENCE = (
    "The guides' range is near-linear scaling, 87.5–100% of the ideal speedup (1.8–2× on 2 GPUs, "
    "3.5–4× on 4, 7–8× on 8): the yardstick esmshard holds itself to for data-parallel "
    "inference, where each GPU embeds its own shards and the GPUs exchange nothing. It is a "
    "target, not a measurement."
)


def _model(model: str, family: str | None, weights: str) -> str:
    """The model, its family as people name it, and whether its weights are random."""
    named = f"{FAMILIES[family].named}, " if family in FAMILIES else ""
    return f"{model} ({named}{weights} weights)"


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


def run_rows(result: dict, run: dict) -> list[dict]:
    """The run itself: when, how long, what command on which inputs, with which model."""
    started, finished = run.get("started_at"), run.get("finished_at")
    made_by = run.get("made_by") or {}
    planned = run.get("planned_at")

    def per_second(value, what):
        return f"{rate(value)} {what}/s" if value else "–"

    rows = [
        ("started", _when(started)),
        ("finished", _when(finished)),
        # a run stopped and finished by the same command again: every command's time
        (
            "time to result, from the run's plan to its merge (every command of the run)",
            duration(finished - planned) if planned and finished else "–",
        ),
        (
            "this command's time, from its start to the merge",
            duration(finished - started) if started and finished else "–",
        ),
        # as the user typed it (`esmshard run`); the Snakemake command it ran is folded below
        ("command", run.get("typed_command") or run.get("command") or "–"),
        ("working folder", run.get("workdir") or "–"),
        ("inputs", "\n".join(run.get("inputs", [])) or "–"),
        ("model", _model(made_by.get("model", result["model"]), made_by.get("model_family"),
                         result["weights"])),
        ("shards", result["n_shards"]),
        ("sequences / residues", f"{result['n_sequences']:,} / {result['n_residues']:,}"
         + (f" ({result['n_residues_kept']:,} kept by stopped jobs, computed before)"
            if result.get("n_residues_kept") else "")),
        ("failed sequences", result["n_failed"]),
        ("time the embed jobs computed (side by side once; loading and the time between "
         "commands left out"
         + (f"; {result['stopped_jobs']} stopped jobs' time in" if result.get("stopped_jobs")
            else "") + ")",
         duration(result.get("jobs_seconds", result["wall_seconds"]))),
        ("the steps' own time: shard; embed jobs; merge",
         "; ".join(duration(t) if t is not None else "–" for t in (
             result.get("step_seconds", {}).get("shard"),
             result.get("jobs_seconds", result["wall_seconds"]),
             result.get("step_seconds", {}).get("merge")))),
        ("speed: residues the finished jobs computed over their own time",
         per_second(result["residues_per_second"], "residues")),
        ("forward-pass tokens of the finished jobs over their time (a masked copy counts its own)",
         per_second(result.get("forward_tokens_per_second"), "tokens")),
        ("load imbalance (slowest shard / mean shard)", result["load_imbalance"]),
        ("idle tail (s): the first slot out of shards waits for the last one", result["idle_tail_seconds"]),
        (
            "compiling (s); shards whose compiled code was in the store",
            f"{_fmt(result['compile_seconds'])}; {result['compile_cache_hits']} of {result['n_shards']}",
        ),
    ]  # fmt: skip
    return [{"what": what, "value": value} for what, value in rows]


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


def mutants_rows(mutants: dict) -> list[dict]:
    """The mutants' run, for the report's page."""
    rows = [
        ("where", mutants["outdir"]),
        ("mutant sequences: computed; found in the store",
         f"{mutants['computed']:,}; {mutants['from_store']:,}"),
    ]  # fmt: skip
    if "n_shards" in mutants:
        tokens = mutants["forward_tokens_per_second"]
        rows += [
            ("shards", mutants["n_shards"]),
            ("time the embed jobs computed", duration(mutants["jobs_seconds"])),
            ("forward passes' tokens (each residue's masked copy its own)",
             f"{mutants['forward_tokens']:,}" + (f", {rate(tokens)} tokens/s" if tokens else "")),
            ("failed sequences", mutants["n_failed"]),
        ]  # fmt: skip
    planned, finished = mutants.get("planned_at"), mutants.get("finished_at")
    if planned and finished:
        rows.append(("time from its plan to its merge", duration(finished - planned)))
    return [{"what": what, "value": value} for what, value in rows]


def figures(result: dict, series: dict) -> dict[str, bytes]:
    """The report's plots, PNG bytes by name."""
    shown = dict(
        timeline=_timeline(result), throughput=_throughput(result), speedup=_speedup(result)
    )
    if series:
        shown["devices"] = _device_plots(result, series)
    return shown


def speedup_rows(result: dict) -> list[dict]:
    """The speedup table: on one GPU the measured figure is a busy share, said as one (as a
    speedup, 0.95× would read as a slowdown)."""

    def measured(m):
        if m["measured_speedup"] is None or m["gpus"] > 1:
            return m["measured_speedup"]
        return f"{m['measured_speedup']:.0%} busy"

    return [
        {
            **m,
            "modelled_efficiency_percent": 100 * m["modelled_efficiency"],
            "measured_speedup": measured(m),
        }
        for m in result["modelled"]
    ]


def _words(text: str) -> str:
    """A sentence as HTML, `code` in backticks shown as code."""
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(text))


def device_rows(result: dict) -> list[dict]:
    return [
        {
            **d,
            "memory_total_GiB": _gib(d["memory_total_bytes"]),
            "mean_memory_used_GiB": _gib(d["mean_memory_used_bytes"]),
            "peak_memory_used_GiB": _gib(d["peak_memory_used_bytes"]),
        }
        for d in result["devices"]
    ]


def _image(png: bytes, alt: str) -> str:
    return f'<img alt="{alt}" src="data:image/png;base64,{base64.b64encode(png).decode()}">'


def shards_section(result: dict, tables: str | None) -> str:
    """The Shards table: every shard, or the LISTED_SHARDS slowest, saying where the rest are."""
    shards = result["shards"]
    # A shard's residues/s is over what its own job computed: the residues that stopped jobs
    # kept are shown beside its residues where a shard has any.
    columns = SHARD_COLUMNS
    if not any(s["n_residues_kept"] for s in shards):
        columns = [c for c in SHARD_COLUMNS if c != "n_residues_kept"]
    if len(shards) <= LISTED_SHARDS:
        return _table(shards, columns)
    slowest = sorted(shards, key=lambda s: s["seconds"], reverse=True)[:LISTED_SHARDS]
    every = "scaling.json" + (f" and <a href='{html.escape(tables)}'>{html.escape(tables)}</a>"
                              if tables else "")  # fmt: skip
    return (
        f"<p>The {LISTED_SHARDS} slowest of {len(shards):,} shards, slowest first; every shard "
        f"is in {every}.</p>" + _table(slowest, columns)
    )


def snakemake_command(run: dict) -> str:
    """The Snakemake command that `esmshard run` ran, folded (the typed one is the table's)."""
    if not run.get("typed_command") or not run.get("command"):
        return ""
    return (
        "<details><summary>The snakemake command that esmshard run ran</summary>"
        f"<p class=text><code>{html.escape(run['command'])}</code></p></details>"
    )


def render_html(
    result: dict, shown: dict[str, bytes], run: dict, computed_with: str = "", tables=None
) -> str:
    """The report's page; `tables`: the path of the Shards table's TSV file, from the page."""
    warning = ""
    if result["weights"] == "random":
        warning = "<p class=warn>Random-weight model: these embeddings are for testing and benchmarking only.</p>"
    if "devices" in shown:
        device_section = _image(shown["devices"], "devices over time")
    else:
        device_section = "<p>No GPU telemetry: NVML was not available to the jobs.</p>"
    cap = cap_sentence(result)
    speedup = f"""<p>{_words(measured_sentence(result["measured"]))}</p>
<p>Modelled: the measured shard times replayed, in their start order, on that many GPUs, each
shard on the first GPU to free up. {_words(cap)}</p>
<p>{_words(GUIDES_SENTENCE)}</p>
{_table(speedup_rows(result), SPEEDUP_COLUMNS)}
{_image(shown["speedup"], "speedup")}"""
    if len(result["devices"]) == 1 and not result["devices"][0]["device"].startswith("cuda"):
        # one CPU slot: a model of 1 to 8 GPUs is not what its reader came for
        speedup = (
            "<details><summary>This run computed on one CPU slot: the model of the same "
            f"shards on 1, 2, 4 and 8 GPUs</summary>{speedup}</details>"
        )
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1"><title>{TITLE}</title>
<style>{STYLE}</style>
</head><body><h1>{TITLE}</h1>{warning}
<h2>This run</h2>
{_table(run_rows(result, run), ["what", "value"], text=("value",), labels=("what",))}
{snakemake_command(run)}
<h2>Speedup and efficiency</h2>
{speedup}
{_image(shown["timeline"], "shard jobs per device slot")}
{_image(shown["throughput"], "throughput per shard")}
<h2>Devices</h2>
{_table(device_rows(result), DEVICE_COLUMNS)}
{device_section}
<h2>Shards</h2>
{shards_section(result, tables)}
{mutants_section(result.get("mutants"))}
{computed_with}
</body></html>
"""


def mutants_section(mutants: dict | None) -> str:
    if not mutants:
        return ""
    table = _table(mutants_rows(mutants), ["what", "value"], text=("value",), labels=("what",))
    return f"<h2>The mutants' run (pseudo_ppl, pllr)</h2>{table}"


def computed_with_section(run: dict) -> str:
    """What computed the run's embeddings (the store's parts included), and a warning where
    they mix precisions."""
    rows = run.get("computed_with", [])
    mixed = mixed_precisions(rows)
    warning = f"<p class=warn>{html.escape(mixed[0].upper() + mixed[1:])}.</p>" if mixed else ""
    made_by = [{"what": name, "value": value} for name, value in run.get("made_by", {}).items()]
    return (
        "<h2>Computed with</h2>"
        + _table(made_by, ["what", "value"], text=("value",), labels=("what",))
        + warning
        + _table(rows, [*COMPUTED_WITH, "parts"])
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
) -> dict:
    """The scaling report of a run's embed jobs (and of its mutants' run, `mutants_run_json`
    and its jobs' metrics, where `pseudo_ppl` or `pllr` made one)."""
    run = json.loads(Path(run_json).read_text()) if run_json else {}
    computed_with = computed_with_section(run) if run else ""
    metrics = load_metrics(metric_files)
    mutants = mutants_summary(mutant_metric_files, mutants_run_json)
    if not metrics:  # every sequence came from the store: no job to report on
        result = {
            "n_shards": 0,
            "n_sequences": 0,
            "note": NOTHING_COMPUTED,
            "esmshard_version": __version__,
            "mutants": mutants,
        }
        write_json(out_json, result)
        write_text(
            out_html,
            f"<!doctype html><html><body><h1>{TITLE}</h1>"
            f"<p>{NOTHING_COMPUTED}</p>{mutants_section(mutants)}{computed_with}</body></html>\n",
        )
        if out_figures:
            with atomic_path(out_figures) as tmp:
                Path(tmp).mkdir()
        return result
    result = {**scaling(metrics), "made_by": run.get("made_by"), "esmshard_version": __version__}
    result["mutants"] = mutants
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
