"""A run's progress as its files show it: each embed job's progress file, and the metrics of its
finished shards (read by `esmshard status` and the scaling report).
"""

import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import NamedTuple

import numpy as np

from ..files import DamagedFileError, read_tsv, write_json
from ..layout import Layout
from ..store import Store, read_json_object
from ..store.location import Location
from ..store.objects import ObjectStoreError
from ..store.runlock import LAUNCHER_ENV
from .object_run import run_bucket

log = logging.getLogger(__name__)


def rate(per_second) -> str:
    """41200.3 -> '41.2k'."""
    if per_second is None:
        return "?"
    return f"{per_second / 1000:.1f}k" if per_second >= 1000 else f"{per_second:.0f}"


def duration(seconds: float) -> str:
    """3725 -> '1h02m', 95 -> '1m35s'."""
    seconds = int(seconds)
    hours, rest = divmod(seconds, 3600)
    return f"{hours}h{rest // 60:02d}m" if hours else f"{rest // 60}m{rest % 60:02d}s"


# The fields `esmshard status` and the report read from the files each embed job writes: a file
# without them (cut short, replaced, another program's) counts as unreadable.
SEND_SECONDS = 10  # how often a job in object storage sends its progress file
PROGRESS_FIELDS = (
    "shard",
    "gpu_slot",
    "device",
    "device_name",
    "host",
    "started_at",
    "n_residues",
)
METRICS_FIELDS = PROGRESS_FIELDS + ("finished_at", "compute_seconds")
# What a stopped job's record keeps of its progress (esmshard.steps.progress.Progress.record_stop)
STOPPED_FIELDS = ("gpu_slot", "device", "device_name", "host", "cuda_visible_devices",
                  "gpu_bus_id", "started_at", "computing_since", "residues_done", "n_residues")  # fmt: skip
_NUMBERS = {"started_at", "finished_at", "n_residues", "residues_done", "compute_seconds", "seconds",
            "n_sequences"}  # fmt: skip


def whole(record, fields) -> bool:
    """Whether a job's file read as JSON holds `fields`, the numbers as numbers."""
    return isinstance(record, dict) and all(
        record.get(name) is not None
        and (name not in _NUMBERS or isinstance(record[name], (int, float)))
        for name in fields
    )


def read_metrics(path) -> dict:
    """A shard's metrics, which merge and the report need whole (a damaged one:
    DamagedFileError, with what repairs it)."""
    try:
        found = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        found = None
    if not whole(found, METRICS_FIELDS + ("seconds", "n_sequences", "model", "weights")):
        raise DamagedFileError(
            f"{path} is not the metrics file its embed job wrote (cut short, or replaced): "
            "remove it and run the same command again (its shard is embedded again)"
        )
    return found


def read_json_files(paths, fields) -> list[dict]:
    """The files of `paths` that read whole (`whole`); the others are left out."""
    out = []
    for path in sorted(paths):
        try:
            found = json.loads(path.read_text())
        except (OSError, ValueError):  # replaced or removed while we read: skip it this time
            continue
        if whole(found, fields):
            out.append(found)
    return out


def slot_key(m: dict) -> str:
    """host:device, the device named by its PCI bus ID where NVML knew it.

    Cluster jobs on one node may all see their own GPU as device 0; the bus ID tells them apart.
    """
    device = m.get("gpu_bus_id") or m.get("cuda_visible_devices") or f"cpu{m['gpu_slot']}"
    return f"{m['host']}:{device}"


def busy_seconds(spans) -> float:
    """The seconds during which at least one of `spans` ((start, end) each) ran: jobs side by
    side count once, the time between two commands of a run not at all."""
    total, reach = 0.0, None
    for start, end in sorted(spans):
        if reach is None or start > reach:
            total += end - start
            reach = end
        elif end > reach:
            total += end - reach
            reach = end
    return total


def computing_span(job: dict, now: float) -> tuple[float, float]:
    """When a job computed (a finished shard's metrics) or has computed so far (a running job's
    progress): from its model loaded to its end, or to `now`. Every rate is of these spans:
    the residues a job computed over the time it computed them."""
    if "finished_at" in job:
        return job["finished_at"] - job["compute_seconds"], job["finished_at"]
    since = job.get("computing_since")
    start = since if isinstance(since, (int, float)) else job["started_at"]
    return start, max(now, start)


def since_warm(job: dict, until: float) -> tuple[float, tuple[float, float]] | None:
    """A running job's work in cost units since its first batch, which paid the job's start-up
    (the ETA's rate leaves that batch out), and that span up to `until`; None before the end
    of its first batch (or from a job of an earlier version, which kept no such mark)."""
    warm, warm_cost = job.get("warm_at"), job.get("warm_cost")
    if not isinstance(warm, (int, float)) or not isinstance(warm_cost, (int, float)):
        return None
    return max(0.0, job["cost_done"] - warm_cost), (warm, max(warm, until))


def eta_seconds(cost_left: float, cost_computed: float, seconds: float) -> float | None:
    """Return the seconds that `cost_left` takes at the rate of `cost_computed` in `seconds`
    (the shard step's cost units): the one ETA of a job's progress line and of `esmshard
    status`; None before anything is computed."""
    if cost_computed <= 0 or seconds <= 0:
        return None
    return max(0.0, cost_left) * seconds / cost_computed


def computed_residues(m: dict) -> int:
    """The residues a finished shard's job computed: its own, less what earlier jobs of the
    shard kept (esmshard.store.pieces), which count as done but not towards its speed."""
    kept = m.get("kept_residues", 0)
    return m["n_residues"] - (kept if isinstance(kept, int) else 0)


def per_slot(metrics: list[dict]) -> dict[str, dict]:
    """Finished shards grouped by device slot: what each device did, and how fast (the residues
    its jobs computed over the time they computed, as the run's own rate is counted)."""
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
        s["residues"] += computed_residues(m)
        s["compute_seconds"] += m["compute_seconds"]
        s.setdefault("spans", []).append(computing_span(m, m["finished_at"]))
        s["memory_total_bytes"] = m.get("memory_total_bytes") or s["memory_total_bytes"]
        peaks = [
            p
            for p in (s["peak_memory_used_bytes"], m.get("peak_memory_used_bytes"))
            if p is not None
        ]
        s["peak_memory_used_bytes"] = max(peaks) if peaks else None
    for s in slots.values():  # over the time its jobs computed, as the run's own rate
        busy = busy_seconds(s.pop("spans"))
        s["residues_per_second"] = s["residues"] / busy if busy > 0 else None
    return slots


# Plain `snakemake` shows no job's progress: there an embed job says its own on its stderr (the
# run's output) every PROGRESS_LINE_SECONDS; under `esmshard run` (LAUNCHER_ENV set) its display
# does. The test hook sets another interval.
PROGRESS_LINE_SECONDS = 30
PROGRESS_LINE_ENV = "ESMSHARD_TEST_PROGRESS_LINE_SECONDS"


class Progress:
    """The embed job's `progress/<shard>.json`, rewritten after each batch for `esmshard status`
    (and, under plain `snakemake`, a line on the job's stderr now and then)."""

    def __init__(self, path, sent_as: str | None = None, **fields):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.fields = {**fields, "residues_done": 0, "cost_done": 0.0, "tokens_done": 0.0}
        every = os.environ.get(PROGRESS_LINE_ENV, PROGRESS_LINE_SECONDS)
        self.line_every = None if LAUNCHER_ENV in os.environ else float(every)
        self.said_at = time.time()
        # in object storage `esmshard status` reads the file in the bucket, sent now and then
        # (as `sent_as`, its path relative to the run's prefix: here it is Snakemake's copy)
        where = Location.of_job()
        self.sent_as = sent_as
        self.bucket = run_bucket(where) if where.in_objects and sent_as else None
        self.sent_at = 0.0

    def computing(self, kept_residues: int, since: float, sampler=None, kept_cost=0.0, cost=None):
        """The job computes from `since` on (its model loaded); what earlier jobs of its shard
        kept (esmshard.store.pieces) is done, and not this job's work nor towards its speed.
        `cost`: the shard's, in the shard step's units (the ETA's), `kept_cost` of it kept."""
        self.fields.update(kept_residues=kept_residues, computing_since=since, cost=cost,
                           kept_cost=kept_cost)  # fmt: skip
        self.fields["residues_done"] += kept_residues
        self.fields["cost_done"] += kept_cost
        self.update(0, sampler)

    def update(self, residues: int, sampler=None, cost: float = 0.0, tokens: float = 0.0):
        """`residues` more done, of `cost` (the shard step's units) and forward-pass `tokens`
        (a masked pass's copy counts its own)."""
        self.fields["residues_done"] += residues
        self.fields["cost_done"] += cost
        self.fields["tokens_done"] += tokens
        self.fields["updated_at"] = time.time()
        if residues and "computing_since" in self.fields and "warm_at" not in self.fields:
            # the first batch's end: the job's start-up paid (the ETA's rate starts here)
            self.fields.update(warm_at=self.fields["updated_at"],
                               warm_cost=self.fields["cost_done"])  # fmt: skip
        if sampler is not None and sampler.samples:
            self.fields["memory_used_bytes"] = sampler.samples[-1]["memory_used_bytes"]
            self.fields["memory_total_bytes"] = sampler.samples[-1]["memory_total_bytes"]
        write_json(self.path, self.fields)
        now = self.fields["updated_at"]
        if self.bucket is not None and now - self.sent_at >= SEND_SECONDS:
            self.send(now)
        if self.line_every is not None and now - self.said_at >= self.line_every:
            self.said_at = now
            print(self.line(now), file=sys.stderr, flush=True)

    def line(self, now: float) -> str:
        """The shard's progress in one line: residues, their rate and the ETA (in cost units,
        as `esmshard status` reckons it), over the time this job has computed."""
        f = self.fields
        done, total = f["residues_done"], f.get("n_residues", 0)
        seconds = now - f.get("computing_since", now)
        speed = (done - f.get("kept_residues", 0)) / seconds if seconds > 0 else None
        cost, warmed = f.get("cost"), since_warm(f, now)
        work, (start, end) = warmed or (0.0, (now, now))
        left = eta_seconds(cost - f["cost_done"], work, end - start) if cost else None
        eta = f"ETA {duration(left)}" if left is not None else "ETA ?"
        return (
            f"esmshard: shard {f.get('shard')}: {done:,}/{total:,} residues "
            f"({100 * done / max(total, 1):.0f}%), {rate(speed)} residues/s, {eta}"
        )

    def __enter__(self):
        return self

    def __exit__(self, exc_type, *exc):
        if exc_type is not None:  # the job failed: its progress is no output of it
            self.path.unlink(missing_ok=True)
            self.record_stop()
            if self.bucket is not None and self.sent_at:
                self.send(time.time(), remove=True)

    def send(self, now: float, remove: bool = False) -> None:
        """Send the progress file to the run's objects (or `remove` it there); a server that
        cannot be reached is said and the job goes on."""
        self.sent_at = now
        try:
            if remove:
                self.bucket.delete(self.sent_as)
            else:
                self.bucket.upload(self.path, self.sent_as)
        except ObjectStoreError as err:
            log.warning("esmshard: progress not sent to the object store: %s", err)

    def record_stop(self) -> None:
        """Add this job's time and work to its shard's stopped jobs, where it computed: the
        run's elapsed time and its report count them (the pieces it kept are done work)."""
        f = self.fields
        if "computing_since" not in f:
            return
        job = {name: f.get(name) for name in STOPPED_FIELDS}
        job.update(stopped_at=time.time(),
                   residues_computed=f["residues_done"] - f.get("kept_residues", 0))  # fmt: skip
        path = stopped_path(self.path)
        try:
            path.parent.mkdir(exist_ok=True)
            write_json(path, {"shard": f.get("shard"), "jobs": [*stopped_jobs(path), job]})
        except OSError as err:  # a full disk: the job's own error is the one to say
            log.warning("%s: the stopped job's time is not recorded (%s)", path, err)


class RecordProgress:
    """The job's progress, record by record: a record's residues when it is done, or a masked
    pass at a time as its passes go (a residue each), at their share of its cost and forward
    tokens; written at most once a second within a record (a GPU passes a batch in
    milliseconds)."""

    def __init__(self, progress: Progress, sampler, lengths: dict, costs: dict, tokens: dict):
        self.progress, self.sampler, self.lengths = progress, sampler, lengths
        self.per_residue = {
            k: (costs[k] / max(n, 1), tokens[k] / max(n, 1)) for k, n in lengths.items()
        }
        self.reported: dict[int, int] = {}  # the residues each record's passes have counted
        self.pending = np.zeros(3)  # residues, cost, tokens not written yet
        self.written_at = time.monotonic()

    def share(self, index: int, residues: int) -> np.ndarray:
        """Residues of record `index`: (residues, cost, tokens)."""
        return residues * np.array([1.0, *self.per_residue[index]])

    def resumed(self, found: dict[int, int]) -> float:
        """Passes that earlier jobs kept (by record): counted, not this job's work; their cost."""
        self.reported.update(found)
        return sum(self.share(k, n)[1] for k, n in found.items())

    def __call__(self, index: int, n: int) -> None:
        """`n` more passes of record `index` (esmshard.store.passes.Passes hears of them)."""
        self.reported[index] = self.reported.get(index, 0) + n
        self.pending += self.share(index, n)
        if time.monotonic() - self.written_at >= 1:
            self.flush()

    def finished(self, members) -> None:
        """The records `members` are done: what their passes have not counted."""
        for k in members:
            self.pending += self.share(k, self.lengths[k] - self.reported.pop(k, 0))
        self.flush()

    def flush(self) -> None:
        residues, cost, tokens = self.pending
        self.progress.update(round(residues), self.sampler, cost, tokens)
        self.pending[:] = 0
        self.written_at = time.monotonic()


def stopped_path(progress_path) -> Path:
    """Where a shard's stopped jobs are recorded: in `stopped/` beside its progress file, so
    that the progress folder's *.json stay one per shard."""
    path = Path(progress_path)
    return path.parent / "stopped" / path.name


def forget_stopped(progress_path) -> None:
    """Remove a shard's record of stopped jobs, and its folder once it holds none."""
    path = stopped_path(progress_path)
    path.unlink(missing_ok=True)
    try:
        path.parent.rmdir()
    except OSError:  # another shard's record is there, or it never was
        pass


def stopped_jobs(path) -> list[dict]:
    """The stopped jobs recorded at `path` (none where it cannot be read)."""
    return valid_stopped((read_json_object(Path(path)) or {}).get("jobs"))


def stopped_span(job: dict) -> tuple[float, float]:
    """The seconds a stopped job computed, from its model loaded to its stop."""
    return job["computing_since"], job["stopped_at"]


def valid_stopped(jobs) -> list[dict]:
    """The records of stopped jobs in `jobs` that hold their span and work as numbers."""
    numbers = ("computing_since", "stopped_at", "residues_computed", "residues_done", "gpu_slot")
    return [
        job for job in jobs if isinstance(job, dict) and isinstance(job.get("host"), str)
        and all(isinstance(job.get(name), (int, float)) for name in numbers)
    ] if isinstance(jobs, list) else []  # fmt: skip


def current_files(layout: Layout, path_of, plan: list[dict], fields) -> list[dict]:
    """The plan's shards' files of one kind written since the plan; older ones are from an earlier
    sharding of this outdir (e.g. with another `shards`) and count for nothing."""
    plan_mtime = Path(layout.plan).stat().st_mtime
    paths = (Path(path_of(row["shard"])) for row in plan)
    fresh = (p for p in paths if p.is_file() and p.stat().st_mtime >= plan_mtime)
    return read_json_files(fresh, fields)


class Finished(NamedTuple):
    """The plan's finished shards: those whose part is in the store (the embed job renames the
    part into place after its metrics, so a job killed between the two has metrics, yet its
    shard is computed again), and the metrics of those that read whole."""

    shards: set[str]
    metrics: list[dict]


def finished(layout: Layout, plan: list[dict]) -> Finished:
    where = json.loads(Path(layout.plan_json).read_text())
    store = Store(where["store"])
    shards = {
        row["shard"] for row in plan if os.path.exists(store.part(where["key"], row["shard"]))
    }
    done = current_files(layout, layout.metrics, plan, METRICS_FIELDS)
    return Finished(shards, [m for m in done if m["shard"] in shards])


def shards_done(layout: Layout, this: dict) -> tuple[int, int]:
    """(this shard's place among the current plan's finished shards, shards): the shards
    finished by the time it finished (its metrics `this`), by their metrics' finished_at, then
    name; two jobs that end at once each count the other only if it finished first."""
    plan = read_tsv(layout.plan)
    found = finished(layout, plan)
    own = (this["finished_at"], this["shard"])
    later = {
        m["shard"]
        for m in found.metrics
        if m["shard"] != this["shard"] and (m["finished_at"], m["shard"]) > own
    }
    return len(found.shards - later), len(plan)
