"""`esmshard gpu-check` (`make gpu-check`): one command, run in a clone, that proves a GPU machine.

It runs, most telling first: the test suite's GPU tests; a whole `snakemake` run with `gpus:
auto` on the real proteome and random weights of esm2_t33_650M's shape in fair-esm's on-disk
format, checking that its telemetry, `esmshard status` and the report's device plots hold real
figures; benchmarks/masked_marginals.py (the masked copies packed, in bf16 and compiled,
against fair-esm's predict.py loop, and the whole-proteome scan's hours); benchmarks/peers.py (every peer a user would pick, beside esmshard's padded, packed and
compiled paths, on the same batches, and the profile of esmshard's packed sides);
benchmarks/throughput.py (fair-esm's own loop against the fast path in bf16, with the
matrix-product peak measured in the same run); and a whole run of ESM C 600M's shape.
Everything goes into gpu-check.json and gpu-check.md, with the device, driver, torch and CUDA
versions, rewritten after each stage. Without network: what it needs is installed (the
wheelhouse, with the gpu-check extra) and the data lie in ESMSHARD_DATA or ../shared/data.

On a machine without CUDA the same plumbing runs on a small model and slice, and the files say
that no GPU was found.
"""

import argparse
import csv
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path

from ..files import unwritable, write_json, write_text
from ..input.datasets import shared_data_dir, write_every_nth_record
from ..layout import Layout
from ..models import ESM2
from ..steps.run_state import read_state
from ..version import __version__
from .gpucheck_markdown import markdown
from .gpucheck_plan import CPU_PLAN, GPU_PLAN, PROTEOME, STAGES
from .status import render

REPO = Path(__file__).resolve().parents[2]
# The packages the check imports beside a run's needs (the gpu-check extra), and what each is for.
CHECK_PACKAGES = {"pytest": "the GPU tests", "transformers": "the peers (EsmModel, EsmcModel, T5)"}


def missing_packages() -> dict[str, str]:
    """The check's packages this Python lacks: {name: one line of what is skipped and why}."""
    import importlib.util

    return {
        name: f"{what} skipped: {name} is not installed (pip install 'esmshard[gpu-check]')"
        for name, what in CHECK_PACKAGES.items()
        if importlib.util.find_spec(name) is None
    }


def environment() -> dict:
    import torch

    from ..compute.telemetry import _nvml

    gpu = torch.cuda.is_available()
    env = {
        "gpu": gpu,
        "device": torch.cuda.get_device_name(0) if gpu else f"CPU ({platform.machine()})",
        "gpus": torch.cuda.device_count() if gpu else 0,
        "driver": None,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "esmshard": __version__,
        "host": platform.node(),
        "cpus": os.cpu_count(),
    }
    nvml = _nvml() if gpu else None
    if nvml is not None:
        driver = nvml.nvmlSystemGetDriverVersion()
        env["driver"] = driver.decode() if isinstance(driver, bytes) else driver
        nvml.nvmlShutdown()
    return env


def gpu_test_files(tests: Path) -> list[str]:
    """Return the suite's files that mark a test `gpu`, or the suite's folder where none does."""
    # pytest collects only these: the whole suite's collection is 20 s of a lent GPU's minutes
    files = [str(p) for p in sorted(tests.rglob("test_*.py")) if "mark.gpu" in p.read_text()]
    return files or [str(tests)]


def run_tests(out: Path, tests: Path = REPO / "tests") -> dict:
    """The tests marked `gpu` (they skip without CUDA), with their counts from pytest's report,
    and, where pytest could not run them (its exit status past 1), why."""
    report = out / "gpu-tests.xml"
    started = time.time()
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider"]
        + ["--junitxml", str(report), *gpu_test_files(tests)],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    (out / "gpu-tests.log").write_text(done.stdout + done.stderr)
    counts = {"passed": 0, "failed": 0, "skipped": 0, "failures": []}
    # this check's report, not an earlier check's (a second allowed for the filesystem's clock)
    if report.is_file() and report.stat().st_mtime >= started - 1:
        for case in ElementTree.parse(report).iter("testcase"):
            name = f"{case.get('classname')}.{case.get('name')}"
            if case.find("skipped") is not None:
                counts["skipped"] += 1
            elif case.find("failure") is not None or case.find("error") is not None:
                counts["failed"] += 1
                counts["failures"].append(name)
            else:
                counts["passed"] += 1
    counts["ok"] = done.returncode == 0 and counts["failed"] == 0
    counts["error"] = None if done.returncode in (0, 1) else why_not_run(done.stdout + done.stderr)
    counts["seconds"] = time.time() - started
    return counts


def why_not_run(output: str) -> str:
    """pytest's own line for what stopped it (its first `E ` line, without the exception's
    class), else its last line."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    errors = [line[1:].strip() for line in lines if line.startswith("E ")]
    line = (errors or lines or ["no output"])[0]
    return re.sub(r"^[\w.]+(Error|Exception|Exit): ", "", line)[:1000]


def run_workflow(out: Path, plan: dict, gpus: int, name: str = "run") -> dict:
    """A whole run through the `snakemake` command line, as users type it, and what it left.
    An ESM-2 model's random weights are written in fair-esm's on-disk format first; ESM C's
    are `random:`."""
    from ..models.esm2 import random_model, write_checkpoint

    work = out / name
    work.mkdir(parents=True, exist_ok=True)
    fasta = shared_data_dir() / PROTEOME
    if plan["every"] > 1:
        write_every_nth_record(fasta, work / "input.fasta", plan["every"])
        fasta = work / "input.fasta"
    model = f"random:{plan['model']}"
    if plan["model"] in ESM2.archs:
        model = write_checkpoint(random_model(plan["model"]), work / "weights", plan["model"])
    outdir = work / "results"
    cmd = [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "-d", str(work)]
    cmd += ["--cores", "all", "--resources", f"gpu={max(gpus, 1)}", "--config"]
    cmd += [f"input={fasta}", f"outdir={outdir}", f"model={model}", "gpus=auto"]
    env = {**os.environ, "ESMSHARD_POOL_DIR": str(work / "gpu-pool")}
    started = time.time()
    done = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True)
    (out / f"snakemake-{name}.log").write_text(done.stdout + done.stderr)
    result = {
        "command": "snakemake " + " ".join(cmd[3:]),
        "ok": done.returncode == 0,
        "seconds": time.time() - started,
    }
    if not result["ok"]:
        result["error"] = (done.stderr or done.stdout)[-2000:]
        return result
    result.update(metrics_figures(outdir))
    result.update(telemetry_figures(outdir))
    result["checks"] = run_checks(result, gpus)
    result["ok"] = all(result["checks"].values())
    return result


def metrics_figures(outdir: Path) -> dict:
    """Sum a finished run's jobs' metrics: its shards, tokens, devices and rates."""
    metrics = [json.loads(p.read_text()) for p in sorted((outdir / "metrics").glob("*.json"))]
    tokens = sum(m["n_residues"] + 2 * m["n_sequences"] for m in metrics)
    return dict(
        shards=len(metrics),
        sequences=sum(m["n_sequences"] for m in metrics),
        tokens=tokens,
        devices=sorted({m["device_name"] for m in metrics}),
        precisions=sorted({m["precision"] for m in metrics}),
        load_seconds=sum(m["load_seconds"] for m in metrics),
        compute_seconds=sum(m["compute_seconds"] for m in metrics),
        compile_seconds=sum(m["compile_seconds"] for m in metrics),
        compile_cache=sorted({m["compile_cache"] for m in metrics}),
        # the host's own work (tokens, read-back, checks, writing) against the time of the batches
        host_fraction=sum(m["host_seconds"] + m["write_seconds"] for m in metrics)
        / sum(m["compute_seconds"] for m in metrics),
        # the whole job: loading, forward passes, read-back and writing
        whole_shard_tokens_per_s_with_loading=tokens / sum(m["seconds"] for m in metrics),
        # after the model is loaded: forward passes, read-back and writing
        whole_shard_tokens_per_s_loaded=tokens / sum(m["compute_seconds"] for m in metrics),
        # the same without compiling, which a shard does once per store and kind of device (the
        # compile cache): what a store's later shards, and shards longer than this one, approach
        whole_shard_tokens_per_s_compiled=tokens
        / sum(m["compute_seconds"] - m["compile_seconds"] for m in metrics),
        peak_gpu_memory_bytes=max((m["torch_peak_allocated_bytes"] or 0) for m in metrics),
    )


def telemetry_figures(outdir: Path) -> dict:
    """Read a finished run's telemetry, status and report: utilization, memory and plots."""
    samples = []
    for path in sorted((outdir / "telemetry").glob("*.tsv")):
        with open(path) as fh:
            samples += list(csv.DictReader(fh, delimiter="\t"))
    utilization = [float(s["utilization_percent"]) for s in samples if s["utilization_percent"]]
    memory = [float(s["memory_used_bytes"]) for s in samples if s["memory_used_bytes"]]
    page = Path(Layout(str(outdir)).scaling_html).read_text()
    return dict(
        telemetry_samples=len(samples),
        mean_utilization_percent=sum(utilization) / len(utilization) if utilization else None,
        peak_memory_used_bytes=max(memory) if memory else None,
        status=render(read_state(outdir)),
        report_has_device_plots="No GPU telemetry" not in page,
    )


def run_checks(result: dict, gpus: int) -> dict[str, bool]:
    """What a whole run must show, on a GPU or on its CPU stand-in."""
    utilization = result["mean_utilization_percent"]
    if gpus:
        return {
            "telemetry holds utilization and memory figures": utilization is not None
            and result["peak_memory_used_bytes"] is not None,
            "the GPU was busy (mean utilization > 0)": bool(utilization),
            "esmshard status names the GPU": any(d in result["status"] for d in result["devices"]),
            "the report draws the device plots": result["report_has_device_plots"],
        }
    return {
        "the report says there was no GPU telemetry": not result["report_has_device_plots"],
        "esmshard status shows the finished run": "finished" in result["status"].lower(),
    }


def throughput_args(plan: dict, gpu: bool, transformers: bool = True) -> list[str]:
    """benchmarks/throughput.py's: fair-esm's loop against the fast path (and transformers'
    T5EncoderModel against esmshard's T5, where the plan has one and transformers is there), one
    repetition each."""
    t5 = [plan["t5_model"], "--t5-layers", "24"] if plan["t5_model"] and transformers else []
    args = ["--models", plan["model"], *t5, "--repeats", "1"]
    return args + (["--device", "cuda", "--precision", "bf16"] if gpu else ["--device", "cpu"])


def clone_first() -> str:
    """PYTHONPATH for the clone's benchmark scripts: the clone's esmshard before any installed
    one, as the workflow gives its jobs (a GPU node's Python holds the wheelhouse's esmshard
    too, whose code and data folder, `../shared/data` beside it, are not the clone's)."""
    return os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH", "")]))


def run_benchmark(
    out: Path, script: str, args: list[str], plan: dict | None, log: str = ""
) -> dict:
    """`python benchmarks/<script>.py` on the plan's proteins and budget (`args` may set other
    ones: they come last; no plan: `args` alone); its JSON lines. Its output goes to
    `<log or script>.log`."""
    cmd = [sys.executable, str(REPO / "benchmarks" / f"{script}.py")]
    if plan is not None:
        cmd += ["--every", str(plan["bench_every"])]
        cmd += ["--toks-per-batch", str(plan["toks_per_batch"])]
    cmd += args
    started = time.time()
    # the log is written as the benchmark runs, unbuffered: a check stopped at a lent GPU's
    # limit keeps the rows of the stage it was in
    log_path = out / f"{log or script}.log"
    with log_path.open("w") as log_file:
        done = subprocess.run(
            cmd,
            cwd=REPO,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONPATH": clone_first(), "PYTHONUNBUFFERED": "1"},
        )
    output = log_path.read_text()
    rows = [json.loads(line) for line in output.splitlines() if line.startswith("{")]
    return {
        "command": "python " + " ".join(cmd[1:]).replace(f"{REPO}/", ""),
        "ok": done.returncode == 0,
        "seconds": time.time() - started,
        "rows": rows,
        "error": None if done.returncode == 0 else output[-2000:],
    }


def results_folder(env: dict, date: str) -> Path | None:
    """On a GPU, where this run's record goes with the figures the docs quote, to be committed:
    benchmarks/results/<date>-<GPU>, then -2, -3, ... for the same day's later runs."""
    if not env["gpu"]:
        return None
    gpu = re.sub(r"[^A-Za-z0-9]+", "-", env["device"]).strip("-")
    folder = REPO / "benchmarks" / "results" / f"{date}-{gpu}"
    run = 1
    while folder.with_name(f"{folder.name}-{run}" if run > 1 else folder.name).exists():
        run += 1
    return folder.with_name(f"{folder.name}-{run}" if run > 1 else folder.name)


def record(out: Path, result: dict, results: Path | None) -> None:
    """gpu-check.json and .md as they stand, and the profile once there is one: written after
    each stage, so that a check stopped midway (a time limit, a lost machine) leaves the
    figures of the stages it finished."""
    write_json(out / "gpu-check.json", result)
    write_text(out / "gpu-check.md", markdown(result))
    if results is not None:
        results.mkdir(parents=True, exist_ok=True)
        # the profile once this check's peers stage wrote it (an earlier check's is not this one's)
        names = ["gpu-check.json", "gpu-check.md"] + ["profile.txt"] * bool(result["peers"])
        for name in names:
            if (out / name).is_file():
                shutil.copyfile(out / name, results / name)


def whole_run(result: dict, out: Path, plan: dict, model: str, stage) -> None:
    print(f"gpu-check: a whole snakemake run of {model} ...", flush=True)
    run = run_workflow(out, {**plan, "model": model}, result["environment"]["gpus"], model)
    stage("workflows", {**result["workflows"], model: run})


def check(out: Path, stages=STAGES) -> dict:
    out = out.resolve()  # the workflow runs with `-d`: a relative path would move with it
    out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    env = environment()
    plan = GPU_PLAN if env["gpu"] else CPU_PLAN
    missing = missing_packages()
    result = {
        "date": time.strftime("%Y-%m-%d"),
        "environment": env,
        "plan": plan,
        "stages": list(stages),
        "skipped": list(missing.values()),
        "tests": None,
        "workflows": {},
        "throughput": None,
        "peers": None,
        "masked_marginals": None,
        "largest": None,
        "neighbours": None,
        "finished": False,
        "ok": False,
        "seconds": 0.0,
    }

    results = results_folder(env, result["date"])

    def stage(key, value):
        result[key] = value
        result["seconds"] = time.time() - started
        record(out, result, results)

    print(f"gpu-check: {env['device']}" + ("" if env["gpu"] else ": no GPU found, CPU plumbing"))
    for line in missing.values():
        print(f"gpu-check: {line}")
    if "tests" in stages and "pytest" not in missing:
        print("gpu-check: the GPU tests ...", flush=True)
        stage("tests", run_tests(out))
    if "whole-run" in stages:
        whole_run(result, out, plan, plan["model"], stage)
    if "masked-marginals" in stages:
        print("gpu-check: masked marginals against predict.py's loop ...", flush=True)
        stage("masked_marginals", run_benchmark(out, "masked_marginals", plan["masked"], plan))
    if "peers" in stages:
        print("gpu-check: every peer beside esmshard ...", flush=True)
        args = plan["peers"] + ["--profile", str(out / "profile.txt")]
        stage("peers", run_benchmark(out, "peers", args, plan))
    if "throughput" in stages:
        print("gpu-check: the throughput benchmark ...", flush=True)
        args = throughput_args(plan, env["gpu"], "transformers" not in missing)
        stage("throughput", run_benchmark(out, "throughput", args, plan))
    if "esmc-whole-run" in stages and plan["esmc_model"]:
        whole_run(result, out, plan, plan["esmc_model"], stage)
    if "largest" in stages:
        print("gpu-check: the largest models ...", flush=True)
        stage("largest", run_benchmark(out, "peers", plan["largest"], plan, "largest"))
    if "neighbours" in stages:
        print("gpu-check: nearest neighbours ...", flush=True)
        stage("neighbours", run_benchmark(out, "neighbours", plan["neighbours"], None))
    result["finished"] = True
    benchmarks = ("tests", "throughput", "peers", "masked_marginals", "largest", "neighbours")
    result["ok"] = all(run["ok"] for run in result["workflows"].values()) and all(
        result[key]["ok"] for key in benchmarks if result[key] is not None
    )
    stage("ok", result["ok"])
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="esmshard gpu-check", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--out", type=Path, default=Path("gpu-check"))
    parser.add_argument(
        "--stages", nargs="+", choices=STAGES, default=list(STAGES), metavar="STAGE",
        help=f"these stages only, in the check's order (default: all: {' '.join(STAGES)})",
    )  # fmt: skip
    args = parser.parse_args(argv)
    problem = unwritable(args.out)  # a file there too: it cannot hold a folder's files
    if problem:
        parser.exit(2, f"esmshard gpu-check: --out {args.out}: {problem}\n")
    result = check(args.out, args.stages)
    print((args.out / "gpu-check.md").read_text())
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
