"""Measure the test suite's CPU-seconds and line coverage at one commit.

Usage: python benchmarks/suite_cost.py COMMIT [--out FILE] [--record FILE] [--pytest-args ARGS]

The commit is cloned beside the checkout (so that its tests find ../shared), its test tools
installed, and `make test` run with coverage.py started in every Python process of the
clone's virtualenv (Snakemake, its jobs and the workflow's scripts included). Nothing else may
use that virtualenv while the suite runs: a test run from another checkout with that Python
(make run VENV=...) would install that checkout's package into it. The CPU-seconds
are the user and system time of the whole process tree that `make test` waited for; the
coverage is that of esmshard/, every process's data combined. Both commits of a comparison are
measured the same way, one after the other on one machine, so coverage's own cost is on both
sides.

Each test's and test file's CPU-seconds (its worker's and the programs it waited for) and wall
time are recorded too, by the pytest plugin benchmarks/cost_recorder.py, which the clone's suite
loads whatever its commit: the files and the 40 costliest tests are listed in the figures by
CPU-seconds, and with --record the files are written as the record that orders `make test`'s
files (tests/file_costs.json).
"""

import argparse
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[1]

# Every Python process of the venv starts coverage where COVERAGE_PROCESS_START names a file.
STARTUP_PTH = "import coverage; coverage.process_startup()\n"

COVERAGERC = """[run]
parallel = true
data_file = {data}
source_pkgs = esmshard
disable_warnings = no-data-collected, module-not-imported, module-not-measured
[paths]
esmshard =
    {clone}/esmshard
    */esmshard
"""


def clone_at(commit: str) -> Path:
    """Clone the checkout at COMMIT into a fresh folder beside it."""
    sha = subprocess.check_output(["git", "rev-parse", commit], cwd=CHECKOUT, text=True).strip()
    clone = CHECKOUT.parent / f"suite-cost-{sha[:7]}"
    subprocess.run(["rm", "-rf", str(clone), str(records_of(clone))], check=True)
    subprocess.run(["git", "clone", "-q", str(CHECKOUT), str(clone)], check=True)
    subprocess.run(["git", "checkout", "-q", sha], cwd=clone, check=True)
    return clone


def records_of(clone: Path) -> Path:
    """Return the folder beside the clone that holds its coverage data and logs."""
    return clone.with_name(clone.name + "-records")


def install(clone: Path) -> Path:
    """Install the clone's test tools and coverage, and return its coverage settings file."""
    # the clone's own install, whatever pip's cache holds of other checkouts'
    env = {**os.environ, "PIP_NO_CACHE_DIR": "1"}
    subprocess.run(["make", ".venv/.test-tools"], cwd=clone, env=env, check=True)
    python = clone / ".venv/bin/python"
    subprocess.run([python, "-m", "pip", "install", "--quiet", "coverage>=7.4"], check=True)
    site = subprocess.check_output(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], text=True
    ).strip()
    Path(site, "suite-cost-coverage.pth").write_text(STARTUP_PTH)
    imported = subprocess.check_output(
        [python, "-c", "import esmshard; print(esmshard.__file__)"], cwd="/", text=True
    )
    if not Path(imported).is_relative_to(clone):  # pip reused another checkout's install
        sys.exit(f"{python} imports esmshard from {imported.strip()}, not from {clone}")
    data = records_of(clone) / ".coverage"
    data.parent.mkdir(exist_ok=True)
    rc = records_of(clone) / "coveragerc"
    rc.write_text(COVERAGERC.format(data=data, clone=clone))
    return rc


def plugin_folder(clone: Path) -> Path:
    """Return a folder that holds the cost recorder alone, as a pytest plugin that any pytest
    with the folder on its path loads (its entry point): not `-p` in make's ARGS, which make
    hands on to the `make` commands that tests run, nor PYTEST_PLUGINS, which reaches the
    pytest of a virtualenv a test makes (the gpu-check's) without the folder on its path."""
    plugins = records_of(clone) / "plugins"
    info = plugins / "cost_recorder-0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    shutil.copy(CHECKOUT / "benchmarks" / "cost_recorder.py", plugins)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: cost-recorder\nVersion: 0\n")
    (info / "entry_points.txt").write_text("[pytest11]\ncost_recorder = cost_recorder\n")
    return plugins


def run_suite(clone: Path, rc: Path, pytest_args: str) -> dict:
    """Run `make test` in the clone and return its CPU-seconds, wall time and summary line."""
    path = os.pathsep.join(filter(None, [str(plugin_folder(clone)), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "COVERAGE_PROCESS_START": str(rc), "PYTHONPATH": path,
           "ESMSHARD_FILE_COSTS": str(records_of(clone) / "file-costs")}  # fmt: skip
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    # Ctrl-C reaches the tests' own children as a user's would: reset, not inherited ignored.
    done = subprocess.run(
        ["make", "test", f"ARGS={pytest_args}"],
        cwd=clone,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    wall = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    (records_of(clone) / "make-test.log").write_text(done.stdout)
    summary = [line for line in done.stdout.splitlines() if re.search(r" in [\d.]+s", line)]
    return {
        "returncode": done.returncode,
        "summary": summary[-1].strip("= ") if summary else "",
        "wall_seconds": round(wall),
        "cpu_seconds": round(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime),
    }


def recorded_costs(clone: Path, kind: str, most: int | None = None) -> dict:
    """Each test file's (kind "files") or test's ("tests") CPU-seconds and wall time, as its
    worker recorded them, most CPU first (the `most` costly)."""
    spent = {}
    for worker in (records_of(clone) / "file-costs").glob("*.json"):
        for name, (cpu, wall) in json.loads(worker.read_text())[kind].items():
            spent[name] = {"cpu_seconds": round(cpu, 1), "wall_seconds": round(wall, 1)}
    return dict(sorted(spent.items(), key=lambda item: -item[1]["cpu_seconds"])[:most])


def coverage_of(clone: Path, rc: Path) -> dict:
    """Combine every process's coverage data and return esmshard/'s line coverage."""
    python = str(clone / ".venv/bin/python")
    subprocess.run([python, "-m", "coverage", "combine", f"--rcfile={rc}", "-q"], check=True)
    report = records_of(clone) / "coverage.json"
    subprocess.run(
        [python, "-m", "coverage", "json", f"--rcfile={rc}", "-q", "-o", str(report)], check=True
    )
    totals = json.loads(report.read_text())["totals"]
    return {
        "statements": totals["num_statements"],
        "covered": totals["covered_lines"],
        "percent": round(100 * totals["covered_lines"] / totals["num_statements"], 1),
    }


def main() -> None:
    """Measure one commit's suite and print (and optionally write) the figures as JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("commit")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--pytest-args", default="", help="passed to make test's ARGS")
    parser.add_argument("--record", type=Path, help="write the files' costs here too "
                        "(tests/file_costs.json: the order of make test's files)")  # fmt: skip
    args = parser.parse_args()
    clone = clone_at(args.commit)
    rc = install(clone)
    figures = {
        "commit": subprocess.check_output(
            ["git", "rev-parse", "HEAD"], cwd=clone, text=True
        ).strip()
    }
    figures.update(run_suite(clone, rc, args.pytest_args))
    figures["files"] = recorded_costs(clone, "files")
    figures["costliest_tests"] = recorded_costs(clone, "tests", most=40)
    figures["coverage"] = coverage_of(clone, rc)
    if args.record:
        args.record.write_text(json.dumps(figures["files"], indent=1) + "\n")
    figures["machine"] = f"{os.cpu_count()} cores, {os.uname().machine}"
    text = json.dumps(figures, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    sys.exit(figures["returncode"])


if __name__ == "__main__":
    main()
