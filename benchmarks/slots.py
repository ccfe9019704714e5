"""One slot against two: the same proteins through the `snakemake` command line with
`--resources gpu=N 'gpus=[...]' shards=auto`, one thread per embed job, alternating.

    python benchmarks/slots.py --every 8 --repeats 2

On a CPU machine the slots are CPU jobs side by side (one thread each); on a GPU machine give
`--slots 1 4` for one GPU against four. Each run has an outdir and store of its own, so every
sequence is computed. Prints, as JSON, each slot count's median wall time of the whole command,
the ratio, and the last run's report figures per slot (busy seconds, idle tail, shards).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from throughput import DEFAULT_FASTA, subset

REPO = Path(__file__).resolve().parents[1]


def run(fasta: Path, work: Path, model: str, slots: int) -> tuple[float, dict]:
    listed = ",".join(map(str, range(slots)))
    cmd = [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "-d", str(work)]
    cmd += ["--cores", str(slots), "--set-threads", "embed=1", "--resources", f"gpu={slots}"]
    cmd += ["--config", f"input={fasta}", f"outdir={work / 'out'}", f"model={model}"]
    cmd += [f"gpus=[{listed}]", "shards=auto"]
    started = time.perf_counter()
    env = {**os.environ, "ESMSHARD_POOL_DIR": str(work / "pool")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"  # its snakemake
    subprocess.run(cmd, cwd=work, env=env, check=True, capture_output=True)
    seconds = time.perf_counter() - started
    report = json.loads((work / "out" / "report" / "scaling.json").read_text())
    return seconds, report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fasta", type=Path, default=DEFAULT_FASTA)
    parser.add_argument("--every", type=int, default=8)
    parser.add_argument("--model", default="random:esm2_t6_8M_UR50D")
    parser.add_argument("--slots", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        fasta = subset(args.fasta, args.every, Path(tmp) / "subset.fasta")
        seconds, reports = {n: [] for n in args.slots}, {}
        for r in range(args.repeats):
            for n in args.slots:
                work = Path(tmp) / f"{n}-{r}"
                work.mkdir()
                wall, reports[n] = run(fasta, work, args.model, n)
                seconds[n].append(wall)
    median = {n: statistics.median(s) for n, s in seconds.items()}
    first, last = args.slots[0], args.slots[-1]
    print(json.dumps({
        "model": args.model, "every": args.every, "residues": reports[first]["n_residues"],
        "seconds": seconds, "median_seconds": median,
        "wall_ratio": median[first] / median[last],
        "per_slot": {n: [{k: d[k] for k in ("slot", "shards", "busy_seconds",
                                            "idle_tail_seconds")} for d in rep["devices"]]
                     for n, rep in reports.items()},
        "measured_speedup": {n: rep["measured"]["speedup"] for n, rep in reports.items()},
    }, indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
