"""The suite's own set-up: `make test-fast` leaves out exactly the tests that start a program."""

import json
import os
import subprocess
import sys

import pytest
from helpers import REPO

UNIT = "tests/steps/test_progress.py::test_the_eta_is_the_cost_left_at_the_rate_computed"
# through a helper of its module that calls `snakemake`
THROUGH_A_HELPER = "tests/store/test_store.py::test_the_same_command_again_computes_nothing"
# through a module-scoped fixture that runs the workflow
THROUGH_A_FIXTURE = "tests/outputs/test_reader.py::test_a_protein_by_id_holds_every_kind_and_layer"


def collected(*args: str) -> set[str]:
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *args],
        cwd=REPO, capture_output=True, text=True,
    )  # fmt: skip
    return {line for line in done.stdout.splitlines() if "::" in line}


def test_a_test_that_starts_a_program_is_marked_end_to_end():
    tests = (UNIT, THROUGH_A_HELPER, THROUGH_A_FIXTURE)
    assert collected("-m", "e2e", *tests) == {THROUGH_A_HELPER, THROUGH_A_FIXTURE}
    assert collected("-m", "not e2e", *tests) == {UNIT}


def test_make_test_fast_runs_the_tests_not_marked_end_to_end():
    # a user's shell, not `make test`'s recipe: its make would have this one print its folder
    made = ("MAKEFLAGS", "MAKELEVEL", "MFLAGS", "ARGS")
    shell = {k: v for k, v in os.environ.items() if k not in made}
    done = subprocess.run(["make", "-n", "test-fast"], cwd=REPO, env=shell, capture_output=True,
                          text=True)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert '-m "not e2e"' in done.stdout.splitlines()[-1]


def test_each_files_cost_is_recorded_and_the_files_run_longest_first_by_the_record(tmp_path):
    files = ["tests/search/test_reliability.py", "tests/steps/test_progress.py"]
    # as benchmarks/suite_cost.py starts a suite (this suite may be a recorded one itself)
    env = {**{k: v for k, v in os.environ.items() if k != "ESMSHARD_FILE_COSTS_OWNER"},
           "ESMSHARD_FILE_COSTS": str(tmp_path), "PYTHONPATH": str(REPO / "benchmarks"),
           "PYTEST_PLUGINS": "cost_recorder"}  # fmt: skip
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-n", "0", *files], cwd=REPO, env=env, capture_output=True,
                          text=True)  # fmt: skip
    assert done.returncode == 0, done.stdout
    (record,) = tmp_path.iterdir()
    spent = json.loads(record.read_text())
    assert record.name == "main.json"
    assert sorted(spent["files"]) == [f[len("tests/") :] for f in files]
    assert all(cpu > 0 and wall > 0 for cpu, wall in spent["files"].values())
    # each test's own, which add up to its file's
    assert {test.split("::")[0] for test in spent["tests"]} == set(files)
    for name, (cpu, wall) in spent["files"].items():
        tests = [
            cost for test, cost in spent["tests"].items() if test.startswith(f"tests/{name}::")
        ]
        assert sum(c for c, _ in tests) == pytest.approx(cpu) and len(tests) > 1
    # a pytest that a test of a recorded suite starts records nothing
    inner = tmp_path / "inner"
    env.update(ESMSHARD_FILE_COSTS=str(inner), ESMSHARD_FILE_COSTS_OWNER="1")
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-n", "0", files[0]], cwd=REPO, env=env, capture_output=True,
                          text=True)  # fmt: skip
    assert done.returncode == 0 and not inner.exists(), done.stdout
    # the committed record orders the whole suite: its longest file is collected first
    record = json.loads((REPO / "tests" / "file_costs.json").read_text())
    longest = max(record, key=lambda name: record[name]["wall_seconds"])
    order = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"],
        cwd=REPO, capture_output=True, text=True,
    ).stdout.splitlines()  # fmt: skip
    assert order[0].startswith(f"tests/{longest}::")
