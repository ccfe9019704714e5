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
from ..models import ESM2, FAMILIES
from ..version import __version__
from .status import read_state, render

REPO = Path(__file__).resolve().parents[2]
PROTEOME = "ecoli_k12_UP000000625.fasta"
# What runs on a GPU, and the stand-in that exercises the same plumbing on a CPU. The whole runs
# take the whole proteome (the figures the docs quote); the benchmarks every `bench_every`-th
# protein (about 340k tokens: enough batches of the GPU's budget), so that the check takes
# minutes on one GPU.
GPU_PLAN = {
    "model": "esm2_t33_650M_UR50D",
    "esmc_model": "esmc_600m",  # a whole run of ESM C too
    # ProtT5-XL-U50's encoder (all 24 layers, random weights) against transformers' T5EncoderModel
    "t5_model": "prot_t5_xl_uniref50",
    "every": 1,
    "bench_every": 4,
    "toks_per_batch": 65536,
    "peers": ["--repeats", "2", "--no-big"],
    # the largest models (benchmarks/peers.py --big) on every 16th protein: a stage of its own,
    # last, so that a check cut short at a lent GPU's limit has everything else
    "largest": ["--esm2", "--esmc", "--big", "--big-every", "4"],
    # the whole model's masked marginals of every 400th protein up to 400 residues (11 proteins,
    # 723k forward tokens: about 2,600 of predict.py's passes)
    "masked": ["--device", "cuda", "--precision", "bf16", "--layers", "33", "--every", "400"]
    + ["--repeats", "1"],
    # each one's forward pass in bf16 against its fp32 one: a GPU test
    # (tests/compute/test_families_on_devices.py)
    "families": [family.named for family in FAMILIES.values()],
}
CPU_PLAN = {
    "model": "esm2_t6_8M_UR50D",
    "esmc_model": None,
    "t5_model": None,
    "every": 100,
    "bench_every": 300,  # 15 proteins: fair-esm's fp32 loop is the slowest side on a CPU
    "toks_per_batch": 4096,
    # ESM C's peers on esmc_300m's first 2 layers: the same code, without building and saving
    # all 30 (10 s of the 33 on 2 cores); the sides on 3 proteins, one packed batch each: the
    # compiles are most of the stage's time on a CPU, and more proteins add shapes to compile
    "peers": ["--esm2", "esm2_t6_8M_UR50D", "--esmc", "esmc_300m", "--esmc-sequences", "2"]
    + ["--esmc-layers", "2", "--no-big", "--repeats", "1", "--threads", "2", "--every", "1500"],
    # the largest models' code on small stand-ins: their first layer, in bf16 (the peers
    # compile FP8's products already; each compile here is seconds of the CPU)
    "largest": ["--esm2", "--esmc", "--big", "--big-models", "esm2_t6_8M_UR50D", "esmc_300m"]
    + ["--big-layers", "1", "--big-every", "1", "--no-fp8", "--threads", "2", "--every", "1500"],
    "masked": ["--model", "esm2_t6_8M_UR50D", "--layers", "1", "--every", "2000", "--longest"]
    + ["200", "--repeats", "1", "--threads", "2"],
    "families": GPU_PLAN["families"],
}
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


def run_tests(out: Path, tests: Path = REPO / "tests") -> dict:
    """The tests marked `gpu` (they skip without CUDA), with their counts from pytest's report,
    and, where pytest could not run them (its exit status past 1), why."""
    report = out / "gpu-tests.xml"
    started = time.time()
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider"]
        + ["--junitxml", str(report), str(tests)],
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
    layout = Layout(str(outdir))
    metrics = [json.loads(p.read_text()) for p in sorted((outdir / "metrics").glob("*.json"))]
    tokens = sum(m["n_residues"] + 2 * m["n_sequences"] for m in metrics)
    result.update(
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
    samples = []
    for path in sorted((outdir / "telemetry").glob("*.tsv")):
        with open(path) as fh:
            samples += list(csv.DictReader(fh, delimiter="\t"))
    utilization = [float(s["utilization_percent"]) for s in samples if s["utilization_percent"]]
    memory = [float(s["memory_used_bytes"]) for s in samples if s["memory_used_bytes"]]
    page = Path(layout.scaling_html).read_text()
    result.update(
        telemetry_samples=len(samples),
        mean_utilization_percent=sum(utilization) / len(utilization) if utilization else None,
        peak_memory_used_bytes=max(memory) if memory else None,
        status=render(read_state(outdir)),
        report_has_device_plots="No GPU telemetry" not in page,
    )
    if gpus:
        result["checks"] = {
            "telemetry holds utilization and memory figures": bool(utilization and memory),
            "the GPU was busy (mean utilization > 0)": bool(utilization) and max(utilization) > 0,
            "esmshard status names the GPU": any(d in result["status"] for d in result["devices"]),
            "the report draws the device plots": result["report_has_device_plots"],
        }
    else:
        result["checks"] = {
            "the report says there was no GPU telemetry": not result["report_has_device_plots"],
            "esmshard status shows the finished run": "finished" in result["status"].lower(),
        }
    result["ok"] = all(result["checks"].values())
    return result


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


def run_benchmark(out: Path, script: str, args: list[str], plan: dict, log: str = "") -> dict:
    """`python benchmarks/<script>.py` on the plan's proteins and budget (`args` may set other
    ones: they come last); its JSON lines. Its output goes to `<log or script>.log`."""
    cmd = [sys.executable, str(REPO / "benchmarks" / f"{script}.py")]
    cmd += ["--every", str(plan["bench_every"]), "--toks-per-batch", str(plan["toks_per_batch"])]
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


# The GPUs that the goals are set for: each goal is an H200's, and an H100's is 0.9 of it.
GOAL_SHARES = {"H200": 1.0, "H100": 0.9}


def goal_on(device: str, goal: int) -> tuple[str, int] | None:
    """(the kind of GPU `device` is, its share of the H200's `goal`), where it has one."""
    for kind, share in GOAL_SHARES.items():
        if kind in device:
            return kind, round(goal * share)
    return None


# The whole run's goal on an H200, with loading (esm2_t33 on the E. coli proteome, one GPU):
# tokens/s.
WHOLE_RUN_GOAL = 150_000


def whole_run_goal_lines(model: str, run: dict) -> list[str]:
    """The GPU plan's whole run against its goal on the GPUs that have one."""
    if model != GPU_PLAN["model"]:
        return []
    lines = []
    goals = dict.fromkeys(goal_on(device, WHOLE_RUN_GOAL) for device in run["devices"])
    for kind, goal in filter(None, goals):  # each kind once, in the devices' order
        speed = run["whole_shard_tokens_per_s_with_loading"]
        lines += [f"With loading on an {kind}: {speed:,.0f} tokens/s (goal {goal:,}).", ""]
    return lines


def whole_run_lines(model: str, run: dict) -> list[str]:
    lines = ["", f"## A whole run: {model}", f"`{run['command']}`", ""]
    if "shards" not in run:
        return lines + ["The run failed:", "```", run.get("error", ""), "```"]
    compiling = "not compiled; "  # off, or shards too short to repay it (compile: auto)
    if run["compile_cache"] != ["off"]:
        compiling = (
            f"compiling {run['compile_seconds']:.1f} s (cache: "
            f"{', '.join(run['compile_cache'])}), {run['whole_shard_tokens_per_s_compiled']:,.0f} "
            "tokens/s once loaded and compiled; "
        )
    lines += [
        f"{run['sequences']} sequences, {run['tokens']:,} tokens in {run['shards']} shard(s) "
        f"on {', '.join(run['devices'])} ({', '.join(run['precisions'])}); whole-shard "
        f"{run['whole_shard_tokens_per_s_with_loading']:,.0f} tokens/s with model loading "
        f"({run['load_seconds']:.1f} s), {run['whole_shard_tokens_per_s_loaded']:,.0f} tokens/s "
        f"once loaded (read-back and writing included); {compiling}"
        "the host's own work per batch (tokens, read-back, checks, writing) "
        f"{run['host_fraction']:.1%} of the batches' time; "
        f"{run['telemetry_samples']} telemetry samples, mean utilization "
        f"{run['mean_utilization_percent'] or 0:.0f}%.",
        "",
    ]
    lines += whole_run_goal_lines(model, run)
    return lines + [f"- [{'x' if ok else ' '}] {name}" for name, ok in run["checks"].items()]


def markdown(result: dict) -> str:
    env = result["environment"]
    lines = [
        f"# esmshard gpu-check, {result['date']}",
        "",
        f"Device: {env['device']} ({env['gpus']} GPU(s)), driver {env['driver']}, torch "
        f"{env['torch']}, CUDA {env['cuda']}, Python {env['python']}, esmshard {env['esmshard']}, "
        f"{env['cpus']} CPUs.",
        "",
    ]
    if not env["gpu"]:
        lines += ["**No GPU was found**: the plumbing ran on the CPU with a small model.", ""]
    if result["stages"] != list(STAGES):
        lines += [f"Stages: {', '.join(result['stages'])} (of {', '.join(STAGES)}).", ""]
    lines += [f"- {line}" for line in result["skipped"]] + [""] * bool(result["skipped"])
    tests = result["tests"]
    if tests is not None:
        lines += [
            "## GPU tests",
            f"{tests['passed']} passed, {tests['failed']} failed, {tests['skipped']} skipped "
            f"({tests['seconds']:.0f} s)"
            + "".join(f"\n- failed: {n}" for n in tests["failures"])
            + (f"\n\nThey did not run: {tests['error']}" if tests.get("error") else ""),
            "",
            "Each family's forward pass in bf16 against its fp32 one is one of them: "
            + "; ".join(result["plan"].get("families", []))
            + ".",
            "",
        ]
    for model, run in result["workflows"].items():
        lines += whole_run_lines(model, run)
    if result["masked_marginals"] is not None:
        lines += masked_lines(result["masked_marginals"])
    if result["peers"] is not None:
        lines += peers_lines(result["peers"])
    if result["throughput"] is not None:
        lines += throughput_lines(result["throughput"])
    if result["largest"] is not None:
        lines += largest_lines(result["largest"])
    verdict = "pass" if result["ok"] else "FAIL"
    if not result["finished"]:
        return "\n".join(lines + ["", unfinished(result)]) + "\n"
    skipped = f", {len(result['skipped'])} part(s) skipped" if result["skipped"] else ""
    lines += ["", f"Verdict: **{verdict}** ({result['seconds']:.0f} s{skipped})"]
    return "\n".join(lines) + "\n"


def throughput_lines(bench: dict) -> list[str]:
    lines = ["", "## Forward-pass throughput", f"`{bench['command']}`", ""]
    table = [r for r in bench["rows"] if "side" in r]
    if table:
        lines += [
            "| model | side | precision | tokens/s | TFLOP/s | peak TFLOP/s | fraction of peak | "
            "speed-up | host's share |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for r in table:
            lines.append(
                f"| {r['model']} | {r['side']} | {r['precision']} | {r['tokens_per_second']:,.0f} | "
                f"{r['achieved_gflops'] / 1e3:,.1f} | {r['matmul_peak_gflops'] / 1e3:,.1f} | "
                f"{r['fraction_of_peak']:.1%} | {r['speedup_vs_peer']:.2f}× | "
                + (f"{r['host_fraction']:.0%} |" if r.get("host_fraction") is not None else "– |")
            )
    if bench["error"]:
        lines += ["The benchmark failed:", "```", bench["error"], "```"]
    return lines


def masked_lines(bench: dict) -> list[str]:
    lines = ["", "## Masked marginals", f"`{bench['command']}`", ""]
    rows = [r for r in bench["rows"] if "tokens_per_s" in r]
    if rows:
        lines += [
            f"{rows[0]['proteins']} proteins, {rows[0]['masked_tokens']:,} forward tokens, "
            f"{rows[0]['layers']} layers of {rows[0]['model']}'s shape:",
            "",
            "| side | precision | tokens/s | against predict.py's loop | error to predict.py's |",
            "|---|---|---|---|---|",
        ]
        lines += [
            f"| {r['side']} | {r['precision']} | {r['tokens_per_s']:,.0f} | "
            f"{r['speedup_over_predict_py']:.2f}× | {r['error_to_predict_py']:.2g} "
            f"({r['error_kind']}) |"
            for r in rows
        ]
    lines += [
        f"\nEvery substitution of the proteome on this device: {r['this_device_hours']:,.2f} h "
        f"({r['this_device_tokens_per_s']:,.0f} tokens/s of the whole model, {r['side']})."
        for r in bench["rows"]
        if "extrapolated" in r
    ]
    if bench["error"]:
        lines += ["The benchmark failed:", "```", bench["error"], "```"]
    return lines


def peers_lines(peers: dict) -> list[str]:
    lines = ["", "## Peers side by side", f"`{peers['command']}`", ""]
    lines += [f"- skipped: {r['skipped']}: {r['why']}" for r in peers["rows"] if "skipped" in r]
    rows = [r for r in peers["rows"] if "share_of_peak" in r]
    if rows:
        lines += [
            "| model | side | precision | tokens/s | share of peak | speed-up | baseline |",
            "|---|---|---|---|---|---|---|",
        ]
        lines += [
            f"| {r['model']} | {r['side']} | {r['precision']} | {r['tokens_per_s']:,.0f} | "
            f"{r['share_of_peak']:.1%} | {r['speedup_vs_baseline']:.2f}× | {r['baseline']} |"
            for r in rows
        ]
    lines += fp8_lines(rows)
    profiled = [r for r in peers["rows"] if "profiled_seconds" in r]
    if profiled:
        lines += ["", "Where the time goes (torch's profiler, one run each; profile.txt):", ""]
    lines += [
        f"- {r['model']}, {r['side']} ({r['precision']}): {r['profiled_seconds']:.2f} s"
        + (
            f", the device busy {r['device_busy_share']:.0%} of it"
            if r["device_busy_share"] is not None
            else ""
        )
        for r in profiled
    ]
    if peers["error"]:
        lines += ["The benchmark failed:", "```", peers["error"], "```"]
    return lines


# The largest models' goals in bf16 on an H200 (GOAL_SHARES: elsewhere), tokens/s
BIG_GOALS = {"esm2_t36_3B_UR50D": 90_000, "esm2_t48_15B_UR50D": 17_000, "esmc_6b": 40_000}


def largest_lines(bench: dict) -> list[str]:
    lines = ["", "## The largest models", f"`{bench['command']}`", ""]
    lines += [big_line(r) for r in bench["rows"] if "build_seconds" in r]
    if bench["error"]:
        lines += ["The benchmark failed:", "```", bench["error"], "```"]
    return lines


def big_line(row: dict) -> str:
    """A largest model's row (benchmarks/peers.py --big): its speed against its goal on the GPUs
    that have one, its peak memory, and its build's and compile's seconds."""
    goal = ""
    if row["precision"] == "bf16" and row["model"] in BIG_GOALS:
        on = goal_on(row["device"], BIG_GOALS[row["model"]])
        goal = f" (goal on an {on[0]}: {on[1]:,})" if on else ""
    memory = (
        f", peak memory {row['peak_memory_bytes'] / 2**30:.1f} GiB"
        if row["peak_memory_bytes"] is not None
        else ""
    )
    return (
        f"\n{row['model']} ({row['layers']} layer{'s' * (row['layers'] != 1)}), {row['side']} "
        f"({row['precision']}): "
        f"{row['tokens_per_s']:,.0f} tokens/s{goal}{memory}; built with random weights on the "
        f"device in {row['build_seconds']:.1f} s, compiled in {row['compile_seconds']:.1f} s."
    )


# FP8's goals (`precision: fp8`): its error against fp32, and its speed against bf16's
FP8_GOALS = {"cosine_p1_vs_fp32": 0.999, "cosine_min_per_protein_vs_fp32": 0.9997, "speedup": 1.3}


def fp8_lines(rows: list[dict]) -> list[str]:
    """FP8's rows of the peers table against their goals: its error, and its tokens/s over the
    same side's in bf16."""
    lines = []
    for row in (r for r in rows if "cosine_p1_vs_fp32" in r and r["side"].endswith("compiled")):
        bf16 = [r for r in rows if r["model"] == row["model"] and r["side"] == row["side"]
                and r["precision"] == "bf16"]  # fmt: skip
        speed = (
            f"; {row['tokens_per_s'] / bf16[0]['tokens_per_s']:.2f}× bf16's tokens/s (goal "
            f"{FP8_GOALS['speedup']}×)"
            if bf16
            else ""
        )
        lines.append(
            f"\n{row['model']} in fp8 against fp32: per-residue cosine "
            f"{row['cosine_p1_vs_fp32']:.5f} at the 1st percentile (goal "
            f"{FP8_GOALS['cosine_p1_vs_fp32']}), least protein's "
            f"{row['cosine_min_per_protein_vs_fp32']:.5f} (goal "
            f"{FP8_GOALS['cosine_min_per_protein_vs_fp32']}){speed}."
        )
    return lines


def unfinished(result: dict) -> str:
    return (
        f"Verdict: **unfinished**: stopped after {result['seconds']:.0f} s, the stages above done"
    )


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


# The check's stages in the order it runs them, most telling first, so that a check cut short
# (a lent GPU's time limit) still has the figures that matter most; `--stages` runs some alone.
STAGES = ("tests", "whole-run", "masked-marginals", "peers", "throughput", "esmc-whole-run",
          "largest")  # fmt: skip


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
    result["finished"] = True
    benchmarks = ("tests", "throughput", "peers", "masked_marginals", "largest")
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
