"""`esmshard status`: a run's state (esmshard.steps.run_state), drawn as a table of its device
slots and a progress line."""

from ..embeddings_h5.in_place import REPAIR
from ..steps.progress import duration, rate, slot_key

GIB = 1 << 30


def _memory(used, total) -> str:
    if used is None or total is None:
        return "-"
    return f"{used / GIB:.1f}/{total / GIB:.1f} GiB"


def later_steps(state: dict) -> list[str]:
    """The lines of the steps after the embed jobs: the mutants' run, the neighbours search."""
    lines = []
    mutants = state.get("mutants")
    if mutants and mutants.get("planned"):
        lines.append(f"mutants ({mutants['outdir']}): {progress_line(mutants)}")
    neighbours = state.get("neighbours")
    if neighbours:
        written = "; neighbours.tsv written" if neighbours["written"] else ""
        running = "".join(
            f"; {job['part']} at {job['fraction']:.0%}"
            + (f", ETA {duration(job['eta_seconds'])}" if job["eta_seconds"] is not None else "")
            for job in neighbours.get("running", [])
        )
        lines.append(f"neighbours: {neighbours['done']} of {neighbours['planned']} search jobs "
                     f"done{running}{written}")  # fmt: skip
    return lines


def render(state: dict) -> str:
    """Draw a run's state: its slots, the running and stopped jobs, and its progress."""
    if state.get("damaged"):
        return (
            f"esmshard status {state['outdir']}: {state['damaged']}; the run's same command "
            "plans it anew"
        )
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
                rate(state["slot_rates"].get(key)),
                memory,
            )
        )
    shown = {row[0] for row in rows}
    for job in state.get("stopped", []):  # a slot whose last job was stopped
        key = slot_key(job)
        if key not in shown and job["last"]:
            shown.add(key)
            done = 100 * job["residues_done"] / max(job["n_residues"] or 1, 1)
            name, device = job.get("device_name") or "", job.get("device") or ""
            rows.append((key, f"{device} {name}" if name != device else device,
                         f"{job['shard']} (stopped at {done:.0f}%, kept)", "0", "-", "-"))  # fmt: skip
    pool = state.get("pool_slots") or 0
    for k in range(len(rows) - 1, pool):  # slots of the pool that have run nothing yet
        rows.append((f"slot {k}", "-", "no shard yet", "0", "-", "-"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [f"esmshard status {state['outdir']}"]
    lines += ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    lines.append(progress_line(state))
    lines += later_steps(state)
    live = [r for r in state["running"] if not r["stale"]]
    if not state["complete"] and not live and not state["run_active"]:
        left = state["residues_total"] - state["residues_done"]
        lines.append(
            f"no job running: {state['residues_kept']:,} residues kept from stopped jobs, "
            f"{left:,} left; the run's same command computes the rest"
        )
    if state.get("broken"):
        more = f" and {len(state['broken']) - 1} more" if len(state["broken"]) > 1 else ""
        lines.append(
            f"embeddings.h5 reads its values in place from store parts gone or changed: "
            f"{state['broken'][0]}{more}; {REPAIR}"
        )
    if state["unreadable_metrics"]:
        n = state["unreadable_metrics"]
        lines.append(
            f"metrics/*.json of {n} finished shard{'s' * (n > 1)} missing or unreadable (cut "
            "short, replaced): left out of the rates; the embeddings are whole"
        )
    return "\n".join(lines)


def progress_line(state: dict) -> str:
    """A planned run's progress on one line: shards, residues, rate, elapsed time and ETA."""
    percent = 100 * state["shards_done"] / state["shards_total"] if state["shards_total"] else 100
    eta = (
        "finished"
        if state["complete"]
        else (
            f"ETA {duration(state['eta_seconds'])}"
            if state["eta_seconds"] is not None
            else "ETA ?"
        )
    )
    return (
        f"shards {state['shards_done']}/{state['shards_total']} ({percent:.0f}%)  "
        f"residues {state['residues_done']:,}/{state['residues_total']:,}  "
        + (
            f"({state['residues_kept']:,} kept from stopped jobs)  "
            if state.get("residues_kept")
            else ""
        )
        + f"{rate(state['residues_per_second'])} residues/s  "
        + (
            f"({rate(state['tokens_per_second'])} tokens/s of passes)  "
            if state.get("tokens_per_second")
            else ""
        )  # fmt: skip
        + f"elapsed {duration(state['elapsed_seconds'])}  {eta}"
        + (f"  {state['failed']} failed" if state["failed"] else "")
    )
