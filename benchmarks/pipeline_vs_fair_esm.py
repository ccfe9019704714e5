"""Residues/s of a whole esmshard run against fair-esm's own batched loop, same model and threads.

    python benchmarks/pipeline_vs_fair_esm.py --model random:esm2_t6_8M_UR50D --threads 2 --repeats 3

Both sides read the same FASTA, use the same weights, token budget and thread count, and keep
the mean of the last layer. The esmshard side is the `snakemake` command line with one shard
(model loading, sharding, merging and the report included); the fair-esm side is the loop of
fair-esm's extract script in memory (model loading included, no file writing). With --repeats
the two sides alternate and their medians are compared.
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from esm.data import FastaBatchedDataset
from throughput import TRUNCATION, peer  # benchmarks/throughput.py: fair-esm's loop, one copy

from esmshard.models import load, parse_spec

REPO = Path(__file__).resolve().parents[1]
DEFAULT_FASTA = REPO.parent / "shared" / "data" / "ecoli_k12_UP000000625.fasta"


def fair_esm_loop(fasta, model, threads, toks_per_batch) -> float:
    """Seconds of fair-esm's extract loop in memory, model loading and FASTA reading included."""
    torch.set_num_threads(threads)
    started = time.perf_counter()
    net, alphabet = load(parse_spec(model))
    peer(net, alphabet, fasta, toks_per_batch, torch.device("cpu"))
    return time.perf_counter() - started


def esmshard_run(fasta, model, threads, toks_per_batch, workdir) -> float:
    started = time.perf_counter()
    subprocess.run(
        [
            "snakemake",
            "-s",
            str(REPO / "Snakefile"),
            "-d",
            str(workdir),
            "--cores",
            str(threads),
            "--set-threads",
            f"embed={threads}",
            "--resources",
            "gpu=1",
            "--quiet",
            "all",
            "--config",
            f"input={fasta}",
            f"model={model}",
            "shards=1",
            f"toks_per_batch={toks_per_batch}",
        ],
        check=True,
        cwd=REPO,
        env={**os.environ, "ESMSHARD_POOL_DIR": str(Path(workdir) / "pool")},
    )
    return time.perf_counter() - started


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fasta", default=str(DEFAULT_FASTA))
    parser.add_argument("--model", default="random:esm2_t6_8M_UR50D")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--toks-per-batch", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    args.fasta = str(Path(args.fasta).resolve())  # the run's working directory is elsewhere

    loop_runs, run_runs = [], []
    for _ in range(args.repeats):  # alternating, so drifts hit both sides alike
        loop_runs.append(fair_esm_loop(args.fasta, args.model, args.threads, args.toks_per_batch))
        with tempfile.TemporaryDirectory() as workdir:
            run_runs.append(
                esmshard_run(args.fasta, args.model, args.threads, args.toks_per_batch, workdir)
            )
    loop_seconds, run_seconds = statistics.median(loop_runs), statistics.median(run_runs)
    residues = sum(
        min(TRUNCATION, len(s)) for s in FastaBatchedDataset.from_file(args.fasta).sequence_strs
    )
    result = {
        "fasta": args.fasta,
        "model": args.model,
        "threads": args.threads,
        "toks_per_batch": args.toks_per_batch,
        "residues": residues,
        "fair_esm_seconds": loop_seconds,
        "fair_esm_residues_per_second": residues / loop_seconds,
        "esmshard_seconds": run_seconds,
        "esmshard_residues_per_second": residues / run_seconds,
        "ratio": loop_seconds / run_seconds,
        "fair_esm_runs": loop_runs,
        "esmshard_runs": run_runs,
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}",
    }
    json.dump(result, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
