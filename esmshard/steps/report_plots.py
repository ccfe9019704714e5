"""Draw the scaling report's figures: the shards' timeline, the throughput, the speedup and each
device's memory and use.
"""

import io

# Figures made directly, not through pyplot: no GUI backend chosen, no figures held
# globally, and a third less to import in each report job.
from matplotlib.figure import Figure

LABELLED_SHARDS = 64  # plots name each shard up to this many


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


def figures(result: dict, series: dict) -> dict[str, bytes]:
    """The report's plots, PNG bytes by name."""
    shown = dict(
        timeline=_timeline(result), throughput=_throughput(result), speedup=_speedup(result)
    )
    if series:
        shown["devices"] = _device_plots(result, series)
    return shown
