"""A pytest plugin that records each test's and test file's CPU-seconds and wall time.

benchmarks/suite_cost.py loads it into any commit's suite (an entry point in a folder of its own
on PYTHONPATH), where ESMSHARD_FILE_COSTS names a folder: each worker writes its costs there as
one JSON object named after the worker, `{"files": {file: [CPU-seconds, wall seconds]}, "tests":
{test: [CPU-seconds, wall seconds]}}`.
"""

import json
import os
import resource
import time
from pathlib import Path

import pytest

RECORD_COSTS = "ESMSHARD_FILE_COSTS"
# The process ID of the session recorded, which its workers and every program a test starts
# inherit: a pytest that a test starts (the gpu-check's, the suite's own tests') records nothing.
OWNER = "ESMSHARD_FILE_COSTS_OWNER"

# this worker's files and tests: [CPU-seconds, wall seconds]
SPENT: dict[str, dict[str, list[float]]] = {"files": {}, "tests": {}}

RECORDING = pytest.StashKey[bool]()


def pytest_configure(config):
    """Record in the session recorded and its workers alone, not in a pytest a test starts."""
    me = str(os.getpid())
    recording = hasattr(config, "workerinput") or os.environ.setdefault(OWNER, me) == me
    config.stash[RECORDING] = recording


def cpu_seconds() -> float:
    """Return this process's CPU-seconds and its waited-for children's (the runs it starts)."""
    mine, children = (resource.getrusage(who) for who in (resource.RUSAGE_SELF,
                                                          resource.RUSAGE_CHILDREN))  # fmt: skip
    return mine.ru_utime + mine.ru_stime + children.ru_utime + children.ru_stime


def suite_path(item) -> str:
    """Name the test's file from the suite's folder, as tests/file_costs.json does."""
    return item.path.relative_to(item.config.rootpath / "tests").as_posix()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Count each test's cost, its fixtures' set-up and tear-down included, to its file."""
    if not item.config.stash[RECORDING]:
        yield
        return
    cpu, wall = cpu_seconds(), time.monotonic()
    yield
    cpu, wall = cpu_seconds() - cpu, time.monotonic() - wall
    SPENT["tests"][item.nodeid] = [cpu, wall]
    spent = SPENT["files"].setdefault(suite_path(item), [0.0, 0.0])
    spent[0] += cpu
    spent[1] += wall


def pytest_sessionfinish(session):
    folder = os.environ.get(RECORD_COSTS)
    if folder and session.config.stash[RECORDING] and SPENT["tests"]:
        # the worker's own name, not one its environment passed on to a pytest it started
        worker = getattr(session.config, "workerinput", {}).get("workerid", "main")
        Path(folder).mkdir(parents=True, exist_ok=True)
        Path(folder, f"{worker}.json").write_text(json.dumps(SPENT))
