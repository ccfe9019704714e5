"""A run's state as its files show it (esmshard.steps.progress): its shards, residues, rates,
elapsed time and ETA, and its jobs running, stale and stopped. `esmshard status` draws it, a
command's start and last lines say it.

The state needs no access to the jobs themselves, only the run's files, so it is read during and
after a run, and on a cluster where the jobs ran on other nodes of a shared filesystem.
"""

import socket
import time
from pathlib import Path
from typing import NamedTuple

from ..embeddings_h5.in_place import checksum_cache
from ..embeddings_h5.scores import MASKED
from ..files import read_tsv
from ..layout import Layout, NeighbourPart
from ..store import Store, in_place_problems, read_json_object
from ..store.pieces import kept_residues
from ..store.runlock import STALE_AFTER_SECONDS, process_alive, run_active
from .progress import (
    METRICS_FIELDS,
    PROGRESS_FIELDS,
    busy_seconds,
    computed_residues,
    computing_span,
    current_files,
    duration,
    eta_seconds,
    finished,
    per_slot,
    since_warm,
    slot_key,
    stopped_jobs,
    stopped_path,
    stopped_span,
    valid_stopped,
)
from .shard import plan_problem


def stale_reason(progress: dict, now: float) -> str | None:
    """Why a job's progress file is no longer updated by a live job, if it is not."""
    if progress.get("host") == socket.gethostname() and "pid" in progress:
        if not process_alive(progress["pid"]):
            return f"process {progress['pid']} is gone"
    updated = progress.get("updated_at")
    quiet = now - (updated if isinstance(updated, (int, float)) else progress["started_at"])
    return f"no update for {duration(quiet)}" if quiet > STALE_AFTER_SECONDS else None


def read_state(outdir: Path, now: float | None = None) -> dict:
    """Read a run's progress from its files in `outdir`, as of `now`: what `render` draws."""
    now = time.time() if now is None else now
    layout = Layout(str(outdir))
    if not Path(layout.plan).exists():
        marks = (layout.log("shard"), Path(layout.run_lock).parent)  # .esmshard/: run or dry run
        started = any(Path(p).exists() for p in marks)
        return {"outdir": str(outdir), "planned": False, "started": started}
    damaged = plan_problem(layout, records=False)
    if damaged:
        return {"outdir": str(outdir), "planned": False, "started": True, "damaged": damaged}
    return planned_state(layout, read_tsv(layout.plan), now)


class Jobs(NamedTuple):
    """A planned run's jobs as its files show them: the `finished` shards and their metrics
    (`done`), the live jobs' progress (`running`) and the dead ones' (`stale`), what jobs
    stopped midway kept for the shards that no job runs now (`waiting`: residues by shard),
    and the in-place output's parts gone or changed (`broken`)."""

    finished: set[str]
    done: list[dict]
    running: list[dict]
    stale: list[dict]
    waiting: dict[str, int]
    broken: list[str]


def read_jobs(layout: Layout, plan: list[dict], where: dict, now: float) -> Jobs:
    """Read the run's metrics, progress files and kept pieces."""
    shards_finished, done = finished(layout, plan)
    broken = []
    if merged(layout):  # finished, whatever became of its store since (removed, moved)
        shards_finished = {row["shard"] for row in plan}
        done = current_files(layout, layout.metrics, plan, METRICS_FIELDS)
        broken = in_place_problems(layout.embeddings, checksum_cache(Path(layout.embeddings)))
    running, stale = [], []
    for r in current_files(layout, layout.progress, plan, PROGRESS_FIELDS + ("residues_done",)):
        if r["shard"] in shards_finished:
            continue
        r["stale"] = stale_reason(r, now)
        (stale if r["stale"] else running).append(r)
    # what interrupted jobs kept, for the shards that no job runs now
    live = shards_finished | {r["shard"] for r in running}
    not_running = {p["shard"] for p in plan} - live
    waiting = (
        kept_residues(Store(where["store"]), where["key"], not_running) if not_running else {}
    )
    return Jobs(shards_finished, done, running, stale, waiting, broken)


def planned_state(layout: Layout, plan: list[dict], now: float) -> dict:
    """The state of a planned run: its shards, residues, rates, time and ETA."""
    where = read_json_object(Path(layout.plan_json)) or {}
    jobs = read_jobs(layout, plan, where, now)
    done, running = jobs.done, jobs.running
    done_residues = sum(int(p["n_residues"]) for p in plan if p["shard"] in jobs.finished)
    done_residues += sum(r["residues_done"] for r in running)  # their kept pieces included
    done_residues += sum(jobs.waiting.values())
    # Kept work is done but no job's speed; the speed is what the jobs computed in the time
    # that any of them computed (esmshard.steps.progress.busy_seconds, computing_span),
    # whichever command ran them.
    kept = sum(jobs.waiting.values()) + sum(job_kept(j) for j in [*done, *running])
    complete = len(jobs.finished) == len(plan)
    # jobs stopped midway (Ctrl-C, a time limit): their time counts, whichever command ran them
    stopped = current_stopped(layout, plan, jobs.finished | {r["shard"] for r in running})
    stopped_before = [j for m in done for j in valid_stopped(m.get("stopped_jobs"))]
    spans = [computing_span(job, now) for job in [*done, *running]]
    spans += [stopped_span(job) for job in [*stopped, *stopped_before]]
    return {
        "outdir": layout.outdir,
        "planned": True,
        "complete": complete,
        "shards_total": len(plan),
        "shards_done": len(jobs.finished),
        "unreadable_metrics": len(jobs.finished) - len(done),
        "residues_total": sum(int(p["n_residues"]) for p in plan),
        "residues_done": done_residues,
        "residues_kept": kept,
        "residues_computed": computed_by_jobs(done, running),
        "residues_per_second": computed_rate(done, running, now),
        # with masked scores a residue is a forward pass of the whole protein: the tokens say
        # what the device does
        "tokens_per_second": tokens_rate(done, running, now) if masked_run(where) else None,
        "slot_rates": slot_rates(done, running, now),
        "elapsed_seconds": busy_seconds(spans),
        "eta_seconds": 0.0 if complete else run_eta(plan, jobs, now),
        "failed": sum(m.get("n_failed", 0) for m in done),
        "slots": per_slot(done),
        "running": jobs.stale + running,  # a live job shows over a dead one of its slot
        "stopped": stopped,  # the last stopped job of each shard no job runs now
        "pool_slots": where.get("slots"),
        "broken": jobs.broken,  # an in-place output's parts gone or changed
        "run_active": run_active(layout.run_lock),  # a command of the run is on
        # `pseudo_ppl` and `pllr`: the mutants' run of their own, under the outdir's mutants/
        "mutants": read_state(Path(layout.mutants.outdir), now)
        if Path(layout.mutants.plan).exists()
        else None,
        "neighbours": neighbour_jobs(layout, now),
    }


def neighbour_jobs(layout: Layout, now: float) -> dict | None:
    """The `neighbours` search jobs done of those planned (their parts' names say how many:
    "i-of-n"), those running with their share done and time left (while a command of the run
    is on), and whether the tables are written; None before any."""
    folder = Path(layout.neighbours_dir)
    parts = [NeighbourPart.named(p.stem) for p in folder.glob("*.npz")]
    parts = [part for part in parts if part is not None]
    running = [read_json_object(p) for p in folder.glob("*.progress.json")]
    running = [r for r in running if r and {"part", "rows", "done", "started_at"} <= r.keys()]
    if not run_active(layout.run_lock):
        running = []  # a killed job's last progress
    counts = [part.count for part in parts] + [
        NeighbourPart.named(r["part"]).count for r in running
    ]
    if not counts:
        return None
    planned = max(counts)
    return {
        "done": sum(1 for part in parts if part.count == planned),
        "planned": planned,
        "running": [search_progress(r, now) for r in sorted(running, key=lambda r: r["part"])],
        "written": Path(layout.neighbours_tsv).exists(),
    }


def search_progress(progress: dict, now: float) -> dict:
    """A running search job's share of its rows done, and its time left at its rate so far
    (None before its first block)."""
    rows, done = max(progress["rows"], 1), progress["done"]
    elapsed = now - progress["started_at"]
    left = elapsed * (rows - done) / done if done else None
    return {"part": progress["part"], "fraction": done / rows, "eta_seconds": left}


def slot_rates(done: list[dict], running: list[dict], now: float) -> dict:
    """Each device slot's rate, counted as the run's: its finished and running jobs."""
    return {
        key: computed_rate(
            [m for m in done if slot_key(m) == key],
            [r for r in running if slot_key(r) == key],
            now,
        )
        for key in {slot_key(job) for job in [*done, *running]}
    }


def run_eta(plan: list[dict], jobs: Jobs, now: float) -> float | None:
    """The seconds left, in the shard step's cost units (esmshard.input.balance): a job
    computes its longest proteins first, whose residues cost more, so that residues/s would
    understate the rest. The rate leaves out a running job's first batch, which pays the job's
    start-up (the first allocations and kernels): from that batch's end to its last update."""
    cost_of = {p["shard"]: float(p["estimated_cost"]) for p in plan}
    share = {p["shard"]: 1 / max(int(p["n_residues"]), 1) for p in plan}
    done_cost = sum(cost_of[s] for s in jobs.finished)
    done_cost += sum(cost_of[s] * kept * share[s] for s, kept in jobs.waiting.items())
    computed_cost = sum(job_cost(m, cost_of[m["shard"]], True)[1] for m in jobs.done)
    cost_spans = [computing_span(m, now) for m in jobs.done]
    for r in jobs.running:
        job_done, job_computed = job_cost(r, cost_of[r["shard"]], False)
        done_cost += job_done
        updated = min(now, last_update(r, now))
        warmed = since_warm(r, updated)
        if warmed:
            computed_cost += warmed[0]
            cost_spans.append(warmed[1])
        else:  # in its first batch (nothing computed yet), or of an earlier version: whole
            computed_cost += job_computed
            cost_spans.append(computing_span(r, updated))
    left = sum(cost_of.values()) - done_cost
    return eta_seconds(left, computed_cost, busy_seconds(cost_spans))


def current_stopped(layout: Layout, plan: list[dict], live: set[str]) -> list[dict]:
    """The last stopped job of each of the plan's shards that is neither finished nor running,
    recorded since the plan (esmshard.steps.progress.Progress.record_stop)."""
    plan_mtime = Path(layout.plan).stat().st_mtime
    found = []
    for row in plan:
        path = stopped_path(layout.progress(row["shard"]))
        if row["shard"] in live or not path.is_file() or path.stat().st_mtime < plan_mtime:
            continue
        jobs = stopped_jobs(path)
        found += [{**job, "shard": row["shard"], "last": job is jobs[-1]} for job in jobs]
    return found


def masked_run(where: dict) -> bool:
    """Whether the planned settings (plan.json's store and key) score masked marginals or
    PLLs: a pass per residue."""
    if "store" not in where or "key" not in where:
        return False
    settings = read_json_object(Path(Store(where["store"]).settings(where["key"]))) or {}
    return any(kind in MASKED for kind in settings.get("include") or [])


def tokens_rate(done: list[dict], running: list[dict], now: float) -> float | None:
    """Forward-pass tokens per second of computing, as `computed_rate` counts residues: the
    finished jobs' (their metrics') and the running jobs' up to their last update."""
    tokens = sum(m.get("forward_tokens") or 0 for m in done)
    tokens += sum(r.get("tokens_done") or 0 for r in running)
    counted = busy_seconds(
        [computing_span(m, now) for m in done]
        + [computing_span(r, min(now, last_update(r, now))) for r in running]
    )
    return tokens / counted if tokens and counted > 0 else None


def computed_by_jobs(done: list[dict], running: list[dict]) -> int:
    """The residues that finished and running jobs computed themselves (what earlier, stopped
    jobs kept is done, but no job's work)."""
    computed = sum(computed_residues(m) for m in done)
    return computed + sum(max(0, r["residues_done"] - job_kept(r)) for r in running)


def computed_rate(done: list[dict], running: list[dict], now: float) -> float | None:
    """Residues computed per second of computing (kept work is no job's speed): the finished
    jobs' over their time, and each running job's up to its last update, whose work is counted
    (not the batch it computes now, which would count as time without work)."""
    computed = computed_by_jobs(done, running)
    counted = busy_seconds(
        [computing_span(m, now) for m in done]
        + [computing_span(r, min(now, last_update(r, now))) for r in running]
    )
    return computed / counted if computed and counted > 0 else None


def last_update(progress: dict, now: float) -> float:
    updated = progress.get("updated_at")
    return updated if isinstance(updated, (int, float)) else now


def job_cost(job: dict, shard_cost: float, finished: bool) -> tuple[float, float]:
    """A job's work in cost units: what is done of its shard, and what the job computed itself
    (what earlier jobs kept left out); from the job's own counts, or in proportion to its
    residues where its file has none (a job of an earlier version)."""
    if isinstance(job.get("cost"), (int, float)) and isinstance(
        job.get("kept_cost"), (int, float)
    ):
        done = shard_cost if finished else job.get("cost_done", 0.0)
        return done, max(0.0, (job["cost"] if finished else done) - job["kept_cost"])
    share = shard_cost / max(job["n_residues"], 1)
    residues = job["n_residues"] if finished else job.get("residues_done", 0)
    return share * residues, share * max(0, residues - job_kept(job))


def job_kept(job: dict) -> int:
    """The residues that earlier, stopped jobs of a job's shard kept (its metrics' or its
    progress file's `kept_residues`)."""
    kept = job.get("kept_residues", 0)
    return kept if isinstance(kept, int) else 0


def merged(layout: Layout) -> bool:
    """Whether the run has finished: its embeddings.h5 written since it was planned."""
    embeddings, plan = Path(layout.embeddings), Path(layout.plan)
    return embeddings.is_file() and embeddings.stat().st_mtime >= plan.stat().st_mtime
