"""The suite's set-up: the order of the test files, the end-to-end mark, and the fixtures (what
the tests share besides them is in helpers.py)."""

import inspect
import json
import re
from pathlib import Path

import pytest
from helpers import TINY_MODEL

# Each test file's CPU-seconds and wall time in a whole suite, as benchmarks/suite_cost.py
# records them: `make test` hands whole files to the workers longest first by wall time
# (--no-loadscope-reorder; xdist's own order, most tests first, started the longest last,
# beside idle workers), then the files the record does not hold, as collected. The SLURM
# tests, which mostly wait on the cluster, overlap the others' work.
FILE_COSTS = Path(__file__).parent / "file_costs.json"


def recorded_costs() -> dict:
    return json.loads(FILE_COSTS.read_text()) if FILE_COSTS.is_file() else {}


def suite_path(path: Path) -> str:
    return path.relative_to(Path(__file__).parent).as_posix()


# A call that starts the workflow or another program: a test that makes one, itself or through
# a fixture or a helper of its module, is end-to-end (`make test-fast` leaves it out).
STARTS_A_PROGRAM = re.compile(
    r"\b(?:snakemake|snakemake_command|kill_9_when|kill_9_after_shards|run_lock_holder"
    r"|subprocess\.\w+|Popen|esmshard_\w+|make_\w+)\("
)


def pytest_collection_modifyitems(items):
    costs = recorded_costs()
    # a stable sort: each file's tests stay together and in their order
    items.sort(key=lambda item: -costs.get(suite_path(item.path), {}).get("wall_seconds", 0))
    for item in items:
        if starts_a_program(item):
            item.add_marker(pytest.mark.e2e)


def starts_a_program(item) -> bool:
    """Whether the test, its fixtures or the functions of its module they call start a program."""
    info = getattr(item, "_fixtureinfo", None)
    fixtures = [d.func for defs in (info.name2fixturedefs.values() if info else []) for d in defs]
    todo, seen = [getattr(item, "function", None), *fixtures], set()
    while todo:
        function = todo.pop()
        if function is None or function in seen:
            continue
        seen.add(function)
        try:
            source = inspect.getsource(function)
        except (OSError, TypeError):
            continue
        if STARTS_A_PROGRAM.search(source):
            return True
        module = inspect.getmodule(function)
        for name in re.findall(r"\b(\w+)\(", source):
            called = inspect.unwrap(getattr(module, name, None) or len)
            if inspect.isfunction(called) and called.__module__ == module.__name__:
                todo.append(called)
    return False


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory) -> Path:
    """A random-weight ESM-2 (real t6 shapes) saved in fair-esm's on-disk format."""
    from esmshard.models.esm2 import random_model, write_checkpoint

    return write_checkpoint(
        random_model(TINY_MODEL), tmp_path_factory.mktemp("weights"), TINY_MODEL
    )
