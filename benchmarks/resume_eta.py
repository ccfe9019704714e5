"""The ETA of a resumed run against the time it then takes, through the `snakemake` command.

    python benchmarks/resume_eta.py --every 3 --json resume_eta.json

A run of every `--every`-th protein of the E. coli proteome (../shared/data) with a random
ESM-2 of esm2_t6's shape on this machine's CPU is stopped as a user stops it (SIGINT to its
process group, Ctrl-C) once `--stop-at` of its residues are done, then the same command runs
again. While it runs, the run's state is read each second as `esmshard status` and `esmshard
run`'s progress display read it (esmshard.steps.run_state.read_state); the first ETA with a
job computing is set against the time from that moment to the run's end (its merge). Then the
numbers a person reads are set side by side: the kept and computed work in the last line,
run.json and `esmshard status`, and the rate of status and of the report.
"""

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from scale import PROTEOME, REPO, cpu_model, memory_gib

from esmshard.layout import Layout
from esmshard.steps.run_state import read_state


def subset(every: int, target: Path) -> int:
    """Every `every`-th record of the proteome; returns the records written."""
    records = [">" + r for r in PROTEOME.read_text().lstrip(">").split("\n>")]
    kept = records[::every]
    target.write_text("\n".join(r.rstrip("\n") for r in kept) + "\n")
    return len(kept)


def state_of(outdir: Path) -> dict:
    try:
        return read_state(outdir)
    except (OSError, ValueError, KeyError):
        return {}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--every", type=int, default=3)
    parser.add_argument("--stop-at", type=float, default=1 / 3)
    parser.add_argument("--model", default="random:esm2_t6_8M_UR50D")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    folder = Path(tempfile.mkdtemp(prefix="esmshard-eta-"))
    fasta = folder / "proteins.fasta"
    records = subset(args.every, fasta)
    outdir = folder / "out"
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    command = ["snakemake", "-s", str(REPO / "Snakefile"), "--cores", "2", "--config",
               f"input={fasta}", f"model={args.model}", f"outdir={outdir}", "shards=1",
               "keep_every=5"]  # fmt: skip

    # the first command, stopped with Ctrl-C once a share of the work is done
    first = subprocess.Popen(command, cwd=folder, env=env, start_new_session=True,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)  # fmt: skip
    while True:
        state = state_of(outdir)
        if (
            state.get("planned")
            and state["residues_done"] >= args.stop_at * state["residues_total"]
        ):
            break
        if first.poll() is not None:
            sys.exit("the first command ended before its stop")
        time.sleep(0.2)
    os.killpg(first.pid, signal.SIGINT)
    stopped = first.communicate(timeout=300)[1].strip().splitlines()[-1]

    # the same command again: its first ETA with a job computing, against the time it takes
    second = subprocess.Popen(command, cwd=folder, env=env, start_new_session=True,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)  # fmt: skip
    first_eta, etas = None, []  # etas: (when, ETA, residues done) of each reading
    while second.poll() is None:
        state = state_of(outdir)
        live = [r for r in state.get("running", []) if not r["stale"]]
        if live and state.get("eta_seconds") is not None:
            if state["residues_done"] > state["residues_kept"]:  # this command's own work too
                first_eta = first_eta or (time.time(), state)
                etas.append((time.time(), state["eta_seconds"], state["residues_done"]))
        time.sleep(1.0)
    said = second.communicate()[1]
    ended = Path(Layout(str(outdir)).run_json).stat().st_mtime
    seen, at_eta = first_eta
    run = json.loads(Path(Layout(str(outdir)).run_json).read_text())
    report = json.loads(Path(Layout(str(outdir)).scaling_json).read_text())
    final = read_state(outdir)
    result = {
        "machine": f"{cpu_model()}, {os.cpu_count()} cores, {memory_gib()} GiB",
        "records": records,
        "model": args.model,
        "stopped_line": stopped,
        "resumed_line": next((ln for ln in said.splitlines() if "resuming:" in ln), None),
        "last_line": next((ln for ln in said.splitlines() if " computed (" in ln), None),
        "first_eta_seconds": round(at_eta["eta_seconds"], 1),
        "first_eta_line_residues_done": at_eta["residues_done"],
        "actual_seconds": round(ended - seen, 1),
        "eta_over_actual": round(at_eta["eta_seconds"] / (ended - seen), 2),
        # every reading: seconds after the first, its ETA over the time then left, residues done
        "etas": [
            [round(when - seen, 1), round(eta / (ended - when), 2), done]
            for when, eta, done in etas
        ],
        "run_json": {
            k: run[k] for k in ("computed", "computed_by_this_command", "kept_from_stopped_jobs")
        },  # fmt: skip
        "status": {
            k: final[k] for k in ("residues_kept", "residues_computed", "residues_per_second")
        },  # fmt: skip
        "report_residues_per_second": report["residues_per_second"],
    }
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0 if re.search(r"kept from stopped jobs", stopped) else 1


if __name__ == "__main__":
    sys.exit(main())
