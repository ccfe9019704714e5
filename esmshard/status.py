"""A run's progress: each embed job's progress file, and `esmshard status`, which reads it.

Status needs no access to the jobs themselves, only the run's files, so it works during and
after a run, and on a cluster where the jobs ran on other nodes of a shared filesystem.
"""

import json
import os
import socket
import time
from pathlib import Path

from .files import read_tsv, write_json
from .layout import Layout
from .store import Store

GIB = 1 << 30
# A job on another host whose progress file has not changed for this long is taken for dead
# (on its own host, a job is dead when its process is gone).
STALE_AFTER_SECONDS = 30 * 60


def rate(per_second) -> str:
    """41200.3 -> '41.2k'."""
    if per_second is None:
        return "?"
    return f"{per_second / 1000:.1f}k" if per_second >= 1000 else f"{per_second:.0f}"


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    hours, rest = divmod(seconds, 3600)
    return f"{hours}h{rest // 60:02d}m" if hours else f"{rest // 60}m{rest % 60:02d}s"


def _memory(used, total) -> str:
    if used is None or total is None:
        return "-"
    return f"{used / GIB:.1f}/{total / GIB:.1f} GiB"


def _read_json(paths) -> list[dict]:
    out = []
    for path in sorted(paths):
        try:
            out.append(json.loads(path.read_text()))
        except (OSError, ValueError):  # replaced or removed while we read: skip it this time
            continue
    return out


def slot_key(m: dict) -> str:
    """host:device, the device named by its PCI bus ID where NVML knew it.

    Cluster jobs on one node may all see their own GPU as device 0; the bus ID tells them apart.
    """
    device = m.get("gpu_bus_id") or m.get("cuda_visible_devices") or f"cpu{m['gpu_slot']}"
    return f"{m['host']}:{device}"


def per_slot(metrics: list[dict]) -> dict[str, dict]:
    """Finished shards grouped by device slot: what each device did, and how fast."""
    slots = {}
    for m in sorted(metrics, key=lambda m: m["started_at"]):
        s = slots.setdefault(
            slot_key(m),
            {
                "host": m["host"],
                "gpu_slot": m["gpu_slot"],
                "device": m["device"],
                "device_name": m.get("gpu_name") or m["device_name"],
                "shards": 0,
                "residues": 0,
                "compute_seconds": 0.0,
                "memory_total_bytes": None,
                "peak_memory_used_bytes": None,
            },
        )
        s["shards"] += 1
        s["residues"] += m["n_residues"]
        s["compute_seconds"] += m["compute_seconds"]
        s["memory_total_bytes"] = m.get("memory_total_bytes") or s["memory_total_bytes"]
        peaks = [
            p
            for p in (s["peak_memory_used_bytes"], m.get("peak_memory_used_bytes"))
            if p is not None
        ]
        s["peak_memory_used_bytes"] = max(peaks) if peaks else None
    for s in slots.values():
        s["residues_per_second"] = (
            s["residues"] / s["compute_seconds"] if s["compute_seconds"] > 0 else None
        )
    return slots


class Progress:
    """The embed job's `progress/<shard>.json`, rewritten after each batch for `esmshard status`."""

    def __init__(self, path, **fields):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.fields = {**fields, "residues_done": 0}

    def update(self, residues: int, sampler=None):
        self.fields["residues_done"] += residues
        self.fields["updated_at"] = time.time()
        if sampler is not None and sampler.samples:
            self.fields["memory_used_bytes"] = sampler.samples[-1]["memory_used_bytes"]
            self.fields["memory_total_bytes"] = sampler.samples[-1]["memory_total_bytes"]
        write_json(self.path, self.fields)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, *exc):
        if exc_type is not None:  # the job failed: its progress is no output of it
            self.path.unlink(missing_ok=True)


def _current(layout: Layout, path_of, plan: list[dict]) -> list[dict]:
    """The plan's shards' files of one kind written since the plan; older ones are from an earlier
    sharding of this outdir (e.g. with another `shards`) and count for nothing."""
    plan_mtime = Path(layout.plan).stat().st_mtime
    paths = (Path(path_of(row["shard"])) for row in plan)
    return _read_json(p for p in paths if p.is_file() and p.stat().st_mtime >= plan_mtime)


def _finished(layout: Layout, plan: list[dict]) -> list[dict]:
    """The metrics of the plan's finished shards. A shard is finished once its part is in the
    store: the embed job renames the part into place after its metrics, so a job killed between
    the two has metrics, yet its shard is computed again."""
    where = json.loads(Path(layout.plan_json).read_text())
    store = Store(where["store"])
    done = _current(layout, layout.metrics, plan)
    return [m for m in done if os.path.exists(store.part(where["key"], m["shard"]))]


def shards_done(layout: Layout) -> tuple[int, int]:
    """(finished shards, shards) of the current plan."""
    plan = read_tsv(layout.plan)
    return len(_finished(layout, plan)), len(plan)


def process_alive(pid: int) -> bool:
    """Whether process `pid` of this host still runs (a zombie, dead but not yet reaped, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # no /proc (macOS): os.kill's answer stands
    return stat[stat.rindex(")") + 2] not in "ZX"


def stale_reason(progress: dict, now: float) -> str | None:
    """Why a job's progress file is no longer updated by a live job, if it is not."""
    if progress.get("host") == socket.gethostname() and "pid" in progress:
        if not process_alive(progress["pid"]):
            return f"process {progress['pid']} is gone"
    quiet = now - progress.get("updated_at", progress["started_at"])
    return f"no update for {_duration(quiet)}" if quiet > STALE_AFTER_SECONDS else None


def read_state(outdir: Path, now: float | None = None) -> dict:
    now = time.time() if now is None else now
    layout = Layout(str(outdir))
    if not Path(layout.plan).is_file():
        marks = (layout.log("shard"), Path(layout.run_lock).parent)  # .esmshard/: run or dry run
        started = any(Path(p).exists() for p in marks)
        return {"outdir": str(outdir), "planned": False, "started": started}
    plan = read_tsv(layout.plan)
    done = _finished(layout, plan)
    finished = {m["shard"] for m in done}
    running, stale = [], []
    for r in _current(layout, layout.progress, plan):
        if r["shard"] in finished:
            continue
        r["stale"] = stale_reason(r, now)
        (stale if r["stale"] else running).append(r)
    total_residues = sum(int(p["n_residues"]) for p in plan)
    done_residues = sum(m["n_residues"] for m in done) + sum(r["residues_done"] for r in running)
    starts = [m["started_at"] for m in done] + [r["started_at"] for r in running]
    complete = len(done) == len(plan)
    end = max(m["finished_at"] for m in done) if complete and done else now
    elapsed = end - min(starts) if starts else 0.0
    speed = done_residues / elapsed if elapsed > 0 else None
    if complete:
        eta = 0.0
    else:
        eta = (total_residues - done_residues) / speed if speed else None
    return {
        "outdir": str(outdir),
        "planned": True,
        "complete": complete,
        "shards_total": len(plan),
        "shards_done": len(done),
        "residues_total": total_residues,
        "residues_done": done_residues,
        "residues_per_second": speed,
        "elapsed_seconds": elapsed,
        "eta_seconds": eta,
        "failed": sum(m.get("n_failed", 0) for m in done),
        "slots": per_slot(done),
        "running": stale + running,  # a live job shows over a dead one of its slot
    }


def render(state: dict) -> str:
    if not state["planned"]:
        if not state["started"]:
            return (
                f"esmshard status {state['outdir']}: no esmshard run here (no shards/plan.tsv, "
                "logs/shard.log or .esmshard/); give the `outdir` of the run's config"
            )
        return f"esmshard status {state['outdir']}: not sharded yet (no shards/plan.tsv)"
    rows = [("slot", "device", "shard", "done", "residues/s", "memory")]
    slots = state["slots"]
    current = {slot_key(r): r for r in state["running"]}
    for key in sorted(set(slots) | set(current)):
        s, r = slots.get(key, {}), current.get(key)
        name = (r or s)["device_name"]
        device = (r or s)["device"]
        if r is not None:
            shard = f"{r['shard']} ({100 * r['residues_done'] / max(r['n_residues'], 1):.0f}%"
            shard += f", stale: {r['stale']})" if r["stale"] else ")"
            memory = _memory(r.get("memory_used_bytes"), r.get("memory_total_bytes"))
        else:
            shard, memory = (
                "idle",
                _memory(s.get("peak_memory_used_bytes"), s.get("memory_total_bytes")),
            )
        rows.append(
            (
                key,
                f"{device} {name}" if name != device else device,
                shard,
                str(s.get("shards", 0)),
                rate(s.get("residues_per_second")),
                memory,
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [f"esmshard status {state['outdir']}"]
    lines += ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    percent = 100 * state["shards_done"] / state["shards_total"] if state["shards_total"] else 100
    eta = (
        "finished"
        if state["complete"]
        else (
            f"ETA {_duration(state['eta_seconds'])}"
            if state["eta_seconds"] is not None
            else "ETA ?"
        )
    )
    lines.append(
        f"shards {state['shards_done']}/{state['shards_total']} ({percent:.0f}%)  "
        f"residues {state['residues_done']:,}/{state['residues_total']:,}  "
        f"{rate(state['residues_per_second'])} residues/s  elapsed {_duration(state['elapsed_seconds'])}  {eta}"
        + (f"  {state['failed']} failed" if state["failed"] else "")
    )
    return "\n".join(lines)
