"""The data path at scale: the real proteome tiled to N records, through the `snakemake` command.

    python benchmarks/scale.py --records 1000000 3000000 10000000 --json scale.json

The E. coli proteome in ../shared/data is repeated under new IDs (`t<copy>_<ID>`, headers and
sequences unchanged) into a temporary folder. The model is a micro ESM-2 (1 layer, D = 32, random
weights) in fair-esm's on-disk format, written by esmshard's checkpoint writer, so that the
steps around the model are what is measured. Each step is its own `snakemake --until <step>`
command under `/usr/bin/time -v` (wall time; peak memory of its processes, Snakemake's own
included; blocks written), and each job's log gives its own time and peak memory (`run_step`).
Then, on the finished run: `esmshard status`, `snakemake -n`, the first lookup by ID, and each
of `--exports` (`esmshard export`, as benchmarks/export.py measures it); the merge again with
`output_values=in_place`, its first lookup and its Parquet export; and, on the largest run, the
shard step alone with each of `--shard-workers` (`--set-threads shard=N`).
Shards are `auto`: a local checkpoint's architecture is unknown to esmshard, so the count is
the one for the 650M model.
"""

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PROTEOME = REPO.parent / "shared" / "data" / "ecoli_k12_UP000000625.fasta"
STEPS = ("shard", "embed", "merge", "all")  # `all` adds the report
# The command line's target for each step (embed jobs exist only once the shard step has run,
# so `--until embed` cannot name them: the rule `embedded` is their target).
TARGETS = {
    "shard": ["--until", "shard"],
    "embed": ["embedded"],
    "merge": ["--until", "merge"],
    "all": [],
}
DONE = re.compile(r"(\w+): done in ([\d.]+) s, peak memory (\d+) MB")


def tile(source: Path, n_records: int, target: Path) -> int:
    """The first n_records of the proteome repeated; returns the residues written."""
    records = [b">" + r for r in source.read_bytes().lstrip(b">").split(b"\n>")]
    residues = [sum(len(line) for line in r.split(b"\n")[1:]) for r in records]
    written = total = 0
    with open(target, "wb") as out:
        copy = 0
        while written < n_records:
            for record, n in zip(records, residues):
                if written == n_records:
                    break
                out.write(b">t%d_" % copy + record[1:].rstrip(b"\n") + b"\n")
                written += 1
                total += n
            copy += 1
    return total


def micro_checkpoint(directory: Path) -> Path:
    import torch
    from esm.model.esm2 import ESM2

    from esmshard.models.esm2 import write_checkpoint

    torch.manual_seed(0)
    model = ESM2(num_layers=1, embed_dim=32, attention_heads=2, alphabet="ESM-1b")
    return write_checkpoint(model.eval(), directory, "esm2_t1_micro")


def timed(command: list[str], cwd: Path) -> dict:
    """Wall seconds, peak memory (bytes) and bytes written of a command, from `/usr/bin/time -v`."""
    result = subprocess.run(
        ["/usr/bin/time", "-v", *command], cwd=cwd, capture_output=True, text=True
    )
    if result.returncode:
        sys.exit(f"failed: {' '.join(command)}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    fields = dict(
        line.strip().rsplit(": ", 1) for line in result.stderr.splitlines() if ": " in line
    )
    h, m, s = (["0"] + fields["Elapsed (wall clock) time (h:mm:ss or m:ss)"].split(":"))[-3:]
    return {
        "wall_seconds": round(int(h) * 3600 + int(m) * 60 + float(s), 2),
        "peak_memory_bytes": int(fields["Maximum resident set size (kbytes)"]) * 1024,
        "blocks_written_bytes": int(fields["File system outputs"]) * 512,
    }


def jobs(logs: Path, step: str) -> dict:
    """The step's jobs as their logs report them: the longest time and the largest peak."""
    found = [
        (float(m.group(2)), int(m.group(3)))
        for path in ([logs / f"{step}.log"] + sorted((logs / step).glob("*.log")))
        if path.exists()
        for m in DONE.finditer(path.read_text())
    ]
    if not found:
        return {}
    return {
        "jobs": len(found),
        "job_seconds_max": max(t for t, _ in found),
        "job_seconds_sum": round(sum(t for t, _ in found), 1),
        "job_peak_memory_bytes_max": max(m for _, m in found) << 20,
    }


def last_job(log: Path) -> dict:
    """The time and peak memory of the step's latest job, as its log (appended to) reports it."""
    seconds, peak = [m.groups()[1:] for m in DONE.finditer(log.read_text())][-1]
    return {"job_seconds": float(seconds), "job_peak_memory_bytes": int(peak) << 20}


def du(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def planned(outdir: Path) -> list[str]:
    """The shards of the run's plan."""
    from esmshard.files import read_tsv

    return [row["shard"] for row in read_tsv(outdir / "shards" / "plan.tsv")]


def tiled_run(folder: Path, n_records: int, config: list[str], threads: int):
    """A fresh `folder` (the benchmark's own) holding the proteome tiled to `n_records`: its
    FASTA file, the run's outdir, the residues, and the `snakemake` command over them (a target
    goes after its first word, before --config)."""
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    fasta = folder / "tiled.fasta"
    residues = tile(PROTEOME, n_records, fasta)
    outdir = folder / "results"
    base = [
        "snakemake", "-s", str(REPO / "Snakefile"), "--cores", str(threads),
        "--resources", "gpu=1", "--quiet", "--config", f"input={fasta}", f"outdir={outdir}",
        *config,
    ]  # fmt: skip
    return fasta, outdir, residues, base


def run(
    n_records: int,
    workdir: Path,
    config: list[str],
    threads: int,
    keep: bool,
    exports,
    shard_workers=(),
) -> dict:
    folder = workdir / f"n{n_records}"
    fasta, outdir, residues, base = tiled_run(folder, n_records, config, threads)
    steps = {}
    outputs = {"shard": "shards", "embed": "store", "merge": "embeddings.h5", "all": "report"}
    for step in STEPS:
        measured = timed(base[:1] + TARGETS[step] + base[1:], folder)  # before --config
        measured["output_bytes"] = du(outdir / outputs[step])
        measured.update(jobs(outdir / "logs", step if step != "all" else "report"))
        steps[step] = measured
        print(n_records, step, json.dumps(measured), flush=True)
    for command, name in (
        (["esmshard", "status", str(outdir)], "status"),
        (base + ["-n"], "dry_run"),
    ):
        steps[name] = timed(command, folder)
    steps["first_lookup"] = first_lookup(outdir / "embeddings.h5")
    from export import measure_export  # export.py imports this module

    for fmt in exports:
        steps[f"export {fmt}"] = measure_export(folder, outdir.name, fmt)
        print(n_records, f"export {fmt}", json.dumps(steps[f"export {fmt}"]), flush=True)
    n_shards = len(planned(outdir))
    # The same outputs with their values in place: the merge again, a lookup and an export.
    placed = timed(base[:1] + ["--until", "merge"] + base[1:] + ["output_values=in_place"], folder)
    placed["output_bytes"] = du(outdir / "embeddings.h5")
    placed.update(last_job(outdir / "logs" / "merge.log"))
    steps["merge in place"] = placed
    steps["first_lookup in place"] = first_lookup(outdir / "embeddings.h5")
    steps["export parquet in place"] = measure_export(folder, outdir.name, "parquet")
    for name in ("merge in place", "first_lookup in place", "export parquet in place"):
        print(n_records, name, json.dumps(steps[name]), flush=True)
    # The shard step alone again with each number of workers, one after another.
    for workers in shard_workers:
        forced = ["--until", "shard", "--forcerun", "shard", "--set-threads", f"shard={workers}"]
        measured = timed(base[:1] + forced + base[1:], folder)
        measured.update(last_job(outdir / "logs" / "shard.log"))
        steps[f"shard, {workers} workers"] = measured
        print(n_records, f"shard, {workers} workers", json.dumps(measured), flush=True)
    shard_seconds = steps["shard"]["job_seconds_max"]
    result = {
        "records": n_records,
        "residues": residues,
        "fasta_bytes": fasta.stat().st_size,
        "shards": n_shards,
        "shard_residues_per_second": round(residues / shard_seconds),
        "steps": steps,
    }
    if not keep:
        shutil.rmtree(folder)
    return result


# One protein by ID in a fresh process: the last record's, so that nothing is found early.
LOOKUP = """
import json, sys, time
import esmshard
def rss():
    return int(next(l for l in open("/proc/self/status") if l.startswith("VmRSS")).split()[1])
with esmshard.open_embeddings(sys.argv[1]) as emb:
    last = emb.ids(len(emb) - 1)[0]
    before, started = rss(), time.perf_counter()
    emb[last]
    seconds = time.perf_counter() - started
    print(json.dumps({"seconds": round(seconds, 4), "added_mb": round((rss() - before) / 1024, 1),
                      "id_index": "id_index" in emb.h5}))
"""


def first_lookup(embeddings: Path) -> dict:
    """The first `emb[ID]` of a newly opened embeddings.h5: seconds and memory it added."""
    done = subprocess.run([sys.executable, "-c", LOOKUP, str(embeddings)], capture_output=True,
                          text=True, check=True)  # fmt: skip
    return json.loads(done.stdout)


def many_shards(n_records: int, n_shards: int, workdir: Path, config: list[str]) -> dict:
    """Thousands of shards: the shard step, `snakemake -n`, `esmshard status` on the plan, and the
    report step's function on n_shards metrics files (copies of one real shard's metrics with
    shard names and times of their own: running thousands of embed jobs here would take hours)."""
    from esmshard.steps.report import write_report

    folder = workdir / f"shards{n_shards}"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    fasta = folder / "tiled.fasta"
    tile(PROTEOME, n_records, fasta)
    outdir = folder / "results"
    head = ["snakemake", "-s", str(REPO / "Snakefile")]
    options = ["--cores", "2", "--resources", "gpu=1", "--config", f"input={fasta}"]
    options += [f"outdir={outdir}", *config, f"shards={n_shards}"]
    base = head + options
    steps = {"shard": timed(base + ["--until", "shard"], folder)}
    steps["shard"].update(jobs(outdir / "logs", "shard"))
    steps["dry_run"] = timed(base + ["-n"], folder)
    steps["status"] = timed(["esmshard", "status", str(outdir)], folder)
    # One real shard's metrics, from a run of the first shard alone.
    names = planned(outdir)
    first = outdir / "metrics" / f"{names[0]}.json"
    timed(head + [str(first)] + options, folder)
    metric = json.loads(first.read_text())
    paths, telemetry = [], []
    for k, name in enumerate(names):
        m = dict(metric, shard=name, gpu_slot=k % 8)
        m["started_at"] = metric["started_at"] + (k // 8) * metric["seconds"]
        m["finished_at"] = m["started_at"] + metric["seconds"]
        path = outdir / "metrics" / f"{name}.json"
        path.write_text(json.dumps(m))
        paths.append(path)
        samples = outdir / "telemetry" / f"{name}.tsv"
        if k:
            shutil.copyfile(outdir / "telemetry" / f"{names[0]}.tsv", samples)
        telemetry.append(samples)
    started = time.perf_counter()
    write_report(paths, telemetry, folder / "scaling.json", folder / "scaling_report.html")
    steps["report_function"] = {"wall_seconds": round(time.perf_counter() - started, 2)}
    steps["status_with_metrics"] = timed(["esmshard", "status", str(outdir)], folder)
    shutil.rmtree(folder)
    return {"records": n_records, "shards": n_shards, "steps": steps}


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.machine()


def memory_gib() -> int:
    return round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--records", type=int, nargs="*", default=[1_000_000, 3_000_000, 10_000_000]
    )
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument(
        "--truncation", type=int, default=64,
        help="truncation_seq_length for the embed jobs: the CPU computes the micro model at "
        "~0.4M residues/s, so full-length records would take hours at 10M records",
    )  # fmt: skip
    parser.add_argument(
        "--many-shards", type=int, nargs=2, default=[1_000_000, 5000],
        metavar=("RECORDS", "SHARDS"), help="0 0 to leave it out",
    )  # fmt: skip
    parser.add_argument(
        "--exports", nargs="*", default=["npy", "parquet"],
        help="the `esmshard export` formats measured on each run (benchmarks/export.py's names)",
    )  # fmt: skip
    parser.add_argument(
        "--shard-workers", type=int, nargs="*", default=[1, 2],
        help="on the largest run, the shard step again with each of these numbers of workers",
    )  # fmt: skip
    parser.add_argument("--json", type=Path)
    parser.add_argument("--keep", action="store_true", help="keep each run's folder")
    args = parser.parse_args(argv)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="esmshard-scale-"))
    checkpoint = micro_checkpoint(workdir / "model")
    config = [
        f"model={checkpoint}",
        f"truncation_seq_length={args.truncation}",
        "toks_per_batch=16384",
        "shards=auto",
    ]
    results = {
        "machine": f"{cpu_model()}, {os.cpu_count()} cores, {memory_gib()} GiB",
        "python": platform.python_version(),
        "config": config,
        "runs": [],
    }
    for n in args.records:
        workers = args.shard_workers if n == max(args.records) else ()
        results["runs"].append(
            run(n, workdir, config, args.threads, args.keep, args.exports, workers)
        )
        save(results, args.json)
    if all(args.many_shards):
        results["many_shards"] = many_shards(*args.many_shards, workdir, config[:-1])
        save(results, args.json)
    return 0


def save(results: dict, path: Path | None) -> None:
    text = json.dumps(results, indent=2)
    print(text)
    if path:
        path.write_text(text + "\n")


if __name__ == "__main__":
    sys.exit(main())
