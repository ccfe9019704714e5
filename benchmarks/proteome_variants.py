"""Every substitution of a proteome (`variants: all`), through the `snakemake` command: each
step's time and peak memory, the variants step's rows per second, one protein's read time from
the Parquet dataset, and the human proteome's cost on one GPU.

    python benchmarks/proteome_variants.py --residues 600000 2400000 --json variants.json

The E. coli proteome in ../shared/data is repeated under new IDs (benchmarks/scale.py's `tile`)
to each `--residues` (2.4M: a yeast's proteome, about 45M substitutions) and run with a micro
ESM-2 (1 layer, D = 32, random weights, benchmarks/scale.py) under `long_sequences: chunk`, so
every residue has its substitutions, scored by `wt_marginals` (one pass per window: the step's
work per row is the same for every strategy, a column of the protein's 20 log-probabilities).
Each step is its own command under `/usr/bin/time -v` (peak memory of Snakemake and the job
together), and each job's log gives its own time and peak memory. The read is
`pyarrow.dataset`'s filter on `id` in a fresh process, of the record in the middle of the
sorted IDs.

The GPU's cost is modelled from the masked-marginal rate that `make gpu-check` measured
(`--gpu-tokens-per-s`: packed, compiled masked copies of the 650M model in bf16 on one H200,
docs/benchmarks.md), with the work counted exactly as the shard step counts it
(esmshard.input.balance.forward_tokens, ProteinGym's optimal window past 1,022 residues) on the
largest tiled proteome, scaled to `--human-residues`. E. coli's proteins are shorter than a
human's (a masked pass costs the protein's length, up to the window), so the figure is a lower
bound for the human proteome.
"""

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from scale import PROTEOME, cpu_model, du, jobs, memory_gib, micro_checkpoint, tiled_run, timed

STEPS = {  # the command line's target of each step, and its log
    "shard": (["--until", "shard"], "shard"),
    "embed": (["embedded"], "embed"),
    "merge": (["--until", "merge"], "merge"),
    "variants": ([], "variants"),
}
H200_MASKED_TOKENS_PER_S = 310_822  # docs/benchmarks.md, NVIDIA H200 2026-11-26, fourth run
WINDOW = 1022

# One protein's rows from the Parquet dataset in a fresh process, by the row groups' statistics.
READ = """
import json, sys, time
started = time.perf_counter()
import pyarrow.dataset as ds
table = ds.dataset(sys.argv[1], format="parquet").to_table(filter=ds.field("id") == sys.argv[2])
print(json.dumps({"seconds": round(time.perf_counter() - started, 3), "rows": table.num_rows}))
"""


def records_for(residues: int) -> int:
    """The records of the tiled proteome that first reach `residues`."""
    from esmshard.input.fasta import read_fasta

    lengths = [len(r.sequence) for r in read_fasta(PROTEOME)]
    total = n = 0
    while total < residues:
        total += lengths[n % len(lengths)]
        n += 1
    return n


def masked_marginal_tokens(fasta: Path) -> int:
    """Every masked pass's tokens, as the shard step counts them under `long_sequences: chunk`."""
    from esmshard.input.balance import forward_tokens
    from esmshard.input.fasta import read_fasta

    lengths = np.array([len(r.sequence) for r in read_fasta(fasta)])
    return int(forward_tokens(lengths, WINDOW, "chunk", ["masked_marginals"]))


def run(residues: int, workdir: Path, config: list[str], threads: int, keep: bool) -> dict:
    folder = workdir / f"r{residues}"
    n_records = records_for(residues)
    fasta, outdir, tiled, base = tiled_run(folder, n_records, config, threads)
    steps = {}
    for step, (target, log) in STEPS.items():
        measured = timed(base[:1] + target + base[1:], folder)  # the target before --config
        measured.update(jobs(outdir / "logs", log))
        steps[step] = measured
        print(residues, step, json.dumps(measured), flush=True)
    counts = json.loads((outdir / "variant_scores" / "_counts.json").read_text())
    rows = counts["scored"]
    ids = sorted(
        line[1:].split(None, 1)[0] for line in fasta.read_text().splitlines() if line[:1] == ">"
    )
    read = subprocess.run(
        [sys.executable, "-c", READ, str(outdir / "variant_scores"), ids[len(ids) // 2]],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    result = {
        "records": n_records,
        "residues": tiled,
        "rows": rows,
        "variants_rows_per_second": round(rows / steps["variants"]["job_seconds_max"]),
        "tsv_bytes": du(outdir / "variant_scores.tsv"),
        "parquet_bytes": du(outdir / "variant_scores"),
        "one_protein_read": json.loads(read.stdout),
        "masked_marginal_tokens": masked_marginal_tokens(fasta),
        "steps": steps,
    }
    print(residues, json.dumps({k: v for k, v in result.items() if k != "steps"}), flush=True)
    if not keep:
        shutil.rmtree(folder)
    return result


def human_cost(largest: dict, human_residues: int, tokens_per_s: float) -> dict:
    """The human proteome's masked marginals on one GPU, from the largest run's work per residue."""
    tokens = largest["masked_marginal_tokens"] * human_residues / largest["residues"]
    return {
        "residues": human_residues,
        "substitutions": 19 * human_residues,
        "masked_marginal_tokens": round(tokens),
        "gpu_tokens_per_s": tokens_per_s,
        "gpu_hours": round(tokens / tokens_per_s / 3600, 2),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--residues", type=int, nargs="*", default=[600_000, 2_400_000])
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument(
        "--human-residues", type=int, default=12_000_000,
        help="the human proteome's residues, for the GPU's cost (default: 5x a yeast's)",
    )  # fmt: skip
    parser.add_argument("--gpu-tokens-per-s", type=float, default=H200_MASKED_TOKENS_PER_S)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--keep", action="store_true", help="keep each run's folder")
    args = parser.parse_args(argv)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="esmshard-variants-"))
    checkpoint = micro_checkpoint(workdir / "model")
    config = [
        f"model={checkpoint}",
        "long_sequences=chunk",
        "variants=all",
        "variant_scoring=[wt_marginals]",
        "toks_per_batch=16384",
        "shards=auto",
    ]
    results = {
        "machine": f"{cpu_model()}, {os.cpu_count()} cores, {memory_gib()} GiB",
        "python": platform.python_version(),
        "config": config,
        "runs": [run(n, workdir, config, args.threads, args.keep) for n in args.residues],
    }
    largest = max(results["runs"], key=lambda r: r["residues"])
    results["human_proteome"] = human_cost(largest, args.human_residues, args.gpu_tokens_per_s)
    text = json.dumps(results, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    if not args.keep:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
