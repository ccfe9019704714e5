"""Incremental runs through the store: a grown input against the same input from scratch.

Run A embeds every second record of the E. coli proteome; run B, into the same outdir, embeds
A's records, 10% new records (from the other half) and 5% of A's sequences under new IDs; the
same command is then given once more. From scratch, B runs in an outdir (and store) of its own.
Every run is the real `snakemake` command line with esm2_t6's architecture (random weights: the
same work as the published weights). The sides alternate, `--repeats` times, and the ratios are
what is quoted: B / B from scratch, and the command again / A.

    python benchmarks/incremental.py --repeats 2 --out docs/incremental.json
"""

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from scale import cpu_model

REPO = Path(__file__).resolve().parents[1]
PROTEOME = REPO.parent / "shared" / "data" / "ecoli_k12_UP000000625.fasta"
MODEL = "random:esm2_t6_8M_UR50D"


def records(path: Path) -> list[str]:
    return [">" + r for r in path.read_text().lstrip(">").split("\n>")]


def inputs(folder: Path) -> tuple[Path, Path, dict]:
    """Run A's and run B's FASTA files, made from the proteome at run time."""
    proteome = [r if r.endswith("\n") else r + "\n" for r in records(PROTEOME)]
    a = proteome[0::2]
    new = proteome[1::2][: len(a) // 10]
    copies = [f">again{k} {r[1:]}" for k, r in enumerate(a[: len(a) // 20])]
    (folder / "a.fasta").write_text("".join(a))
    (folder / "b.fasta").write_text("".join(a + new + copies))
    counts = {"a_records": len(a), "new_records": len(new), "copies": len(copies)}
    return folder / "a.fasta", folder / "b.fasta", counts


def timed(fasta: Path, outdir: Path, threads: int) -> float:
    command = [
        "snakemake", "-s", str(REPO / "Snakefile"), "--cores", str(threads), "--resources",
        "gpu=1", "--quiet", "--config", f"input={fasta}", f"outdir={outdir}", f"model={MODEL}",
    ]  # fmt: skip
    started = time.perf_counter()
    subprocess.run(command, cwd=outdir.parent, check=True, capture_output=True)
    return time.perf_counter() - started


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    rounds = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        a, b, counts = inputs(folder)
        for repeat in range(args.repeats):
            shutil.rmtree(folder / "incremental", ignore_errors=True)
            shutil.rmtree(folder / "scratch", ignore_errors=True)
            seconds = {}
            if repeat % 2:  # alternate which side runs first
                seconds["b_from_scratch"] = timed(b, folder / "scratch", args.threads)
            seconds["a"] = timed(a, folder / "incremental", args.threads)
            seconds["b"] = timed(b, folder / "incremental", args.threads)
            seconds["b_again"] = timed(b, folder / "incremental", args.threads)
            if not repeat % 2:
                seconds["b_from_scratch"] = timed(b, folder / "scratch", args.threads)
            run = json.loads((folder / "incremental" / "run.json").read_text())
            rounds.append(
                {
                    "seconds": {k: round(v, 1) for k, v in seconds.items()},
                    "b_over_b_from_scratch": round(seconds["b"] / seconds["b_from_scratch"], 3),
                    "again_over_a": round(seconds["b_again"] / seconds["a"], 3),
                    "run_b": run,
                }
            )
            print(json.dumps(rounds[-1]), flush=True)
    result = {
        "machine": f"{cpu_model()}, {args.threads} threads",
        "python": sys.version.split()[0],
        "model": MODEL,
        **counts,
        "rounds": rounds,
    }
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
