"""The documentation (README.md, docs/, config/README.md, CHANGELOG.md): every command it shows
exists, with the options it gives; the workflow commands run (as dry runs here; the full runs
are in the tests named in RUN_BY); every config key it names is one; no link is broken."""

import functools
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib
from helpers import (
    CLOUD,
    CONFIG_SCHEMA,
    DATA,
    PROTEINS,
    REPO,
    S3_ENV,
    TINY_MODEL,
    clone_of_workflow,
    edited_cloud_profile,
    moto_server,
    read_records,
    s3_client,
)

import esmshard

PAGES = [REPO / "README.md", REPO / "CHANGELOG.md", REPO / "config" / "README.md",
         *sorted((REPO / "docs").glob("*.md"))]  # fmt: skip
BIN = Path(sys.executable).parent
KEYS = set(CONFIG_SCHEMA["properties"])
# The commands that a dry run cannot check, and the test that runs each as the docs show it (the
# benchmarks' commands, run by hand, are checked for their options only).
RUN_BY = {
    "make run": "test_readme.py::test_make_run_writes_the_example_and_runs_the_workflow",
    "make test": "../.ci/run",
    "make gpu-check": "test_install.py::test_make_gpu_check_runs_in_a_gpu_nodes_python_with_the",
    "esmshard plan": "commands/test_plan.py::test_the_docs_plan_shows_what_they_print_and_their_run",
    "esmshard status": "test_readme.py::test_esmshard_run_and_status_as_the_readme_types_them",
    "esmshard export": "test_readme.py::test_reading_and_exporting_as_the_docs_show",
    "esmshard neighbours": "commands/test_neighbours.py::test_the_docs_command_runs_as_shown",
    "esmshard ensemble": "workflow/test_variant_effects.py::test_an_ensemble_is_the_mean_of_its_runs",
    "esmshard heatmap": "workflow/test_long_proteins.py::test_every_substitution_of_long_proteins_equals_its_recipe",
    "pip install esmshard-": "test_install.py::test_the_wheel_runs_from_an_empty_folder_as_snake",
    "pip install esmshard snakedeploy": "test_install.py::test_a_deployed_workflow_runs_with_the",
    "pip install --config-settings editable_mode=compat -e": "../.ci/run",  # make installs so
    "pip install --no-index --find-links": "test_install.py::test_the_wheelhouse_installs_offline",
    # the hosted repository's route needs the network: its options are checked
    "snakedeploy deploy-workflow": "test_install.py::test_a_deployed_workflow_runs_with_the",
    "esmshard deploy": "test_install.py::test_a_deployed_workflow_runs_with_the",
    "cd deployed": "test_install.py::test_a_deployed_workflow_runs_with_the",
}


class Command:
    def __init__(self, page: Path, line: str):
        self.page, self.line = page, line.strip()
        self.argv = shlex.split(self.line, comments=True)

    def __repr__(self):
        return f"{self.page.relative_to(REPO)}: {self.line}"

    @property
    def program_argv(self) -> list[str]:
        """The program's words, without `&&` and a leading `cd DIR` (`cd deployed && ...`)."""
        argv = [a for a in self.argv if a != "&&"]
        return argv[2:] if argv[0] == "cd" else argv


def documented_commands() -> list[Command]:
    """The shell lines of every code block (a block's `&&` steps as one line)."""
    found = []
    for page in PAGES:
        for language, body in re.findall(r"^```(\w*)\n(.*?)^```", page.read_text(), re.M | re.S):
            if language in ("", "sh", "bash"):
                found += [Command(page, line) for line in body.splitlines()]
    return [c for c in found if c.argv]


COMMANDS = documented_commands()


@functools.cache
def help_text(*argv: str) -> str:
    done = subprocess.run([str(BIN / argv[0]), *argv[1:], "--help"], capture_output=True,
                          text=True, cwd=REPO)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


# Each benchmark's --help in one Python: each alone would import torch again, 2 to 4 s a script.
BENCHMARK_HELPS = """
import contextlib, io, json, runpy, sys
sys.path.insert(0, "benchmarks")
helps = {}
for script in sys.argv[1:]:
    sys.argv = [script, "--help"]
    with contextlib.redirect_stdout(io.StringIO()) as printed, contextlib.suppress(SystemExit):
        runpy.run_path(script, run_name="__main__")
    helps[script] = printed.getvalue()
print(json.dumps(helps))
"""


@functools.cache
def benchmark_helps() -> dict[str, str]:
    """The --help of each benchmark that a page shows, by its path."""
    scripts = sorted({c.program_argv[1] for c in COMMANDS if c.program_argv[:1] == ["python"]})
    done = subprocess.run([sys.executable, "-c", BENCHMARK_HELPS, *scripts], capture_output=True,
                          text=True, cwd=REPO)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def options(argv: list[str]) -> list[str]:
    return [a.split("=")[0] for a in argv if a.startswith("-") and a != "--"]


def config_values(argv: list[str]) -> list[str]:
    """The KEY=VALUE items after --config."""
    if "--config" not in argv:
        return []
    rest = argv[argv.index("--config") + 1 :]
    return [a for a in rest[: next((i for i, a in enumerate(rest) if a.startswith("-")), None)]]


def test_the_docs_show_commands_of_each_kind():
    programs = {c.argv[0] for c in COMMANDS}
    assert {"snakemake", "esmshard", "make", "pip", "snakedeploy", "python"} <= programs


@pytest.mark.parametrize("command", COMMANDS, ids=repr)
def test_every_command_exists_with_the_options_it_shows(command):
    argv = command.program_argv
    if not argv:
        return  # a `cd` alone
    program = argv[0]
    if program == "make":
        targets = re.findall(r"^([\w-]+):", (REPO / "Makefile").read_text(), re.M)
        assert argv[1] in targets
    elif program == "esmshard":
        assert set(options(argv)) <= set(re.findall(r"--?[\w-]+", help_text("esmshard", argv[1])))
    elif program == "snakedeploy":
        assert set(options(argv)) <= set(re.findall(r"--[\w-]+", help_text(*argv[:2])))
    elif program == "snakemake":
        assert set(options(argv)) <= set(re.findall(r"--[\w-]+", help_text("snakemake")))
    elif program == "python":
        script = REPO / argv[1]
        assert script.is_file(), f"{command}: no {argv[1]}"
        assert set(options(argv)) <= set(re.findall(r"--[\w-]+", benchmark_helps()[argv[1]]))
    elif program == "pip":
        extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
        for wanted in re.findall(r"\[([\w,]+)\]", command.line):
            assert set(wanted.split(",")) <= set(extras["optional-dependencies"])
    elif program == "cp":
        assert (REPO / argv[2]).is_dir()
    else:
        pytest.fail(f"{command}: a program the docs test does not know")
    for item in config_values(argv):
        assert item.split("=")[0] in KEYS, f"{command}: {item} is no config key"
    for version in re.findall(r"(?:-|\bv)(\d+\.\d+\.\d+)\b", command.line):
        assert version == esmshard.__version__, f"{command}: another version than {version}"


def workflow_commands() -> list[Command]:
    """The `snakemake` and `esmshard run` commands, which a dry run checks here."""
    return [c for c in COMMANDS if c.argv[0] == "snakemake" or c.argv[:2] == ["esmshard", "run"]]


def test_every_command_is_run_by_a_test():
    for command in COMMANDS:
        if command in workflow_commands() or command.argv[0] in ("cp", "python"):
            continue  # dry runs below; cp is one step of a command below; benchmarks by hand
        runner = next((RUN_BY[p] for p in RUN_BY if command.line.startswith(p)), None)
        assert runner, f"{command}: no test runs it"
        path, _, test = runner.partition("::")
        text = (REPO / "tests" / path).read_text()
        assert not test or f"def {test}" in text, f"{command}: {runner} is no test"


@pytest.fixture(scope="module")
def s3_port():
    """moto's S3 server, whose bucket holds the input that the docs' cloud commands name."""
    with moto_server() as port:
        s3_client(port).create_bucket(Bucket="lab")
        yield port


@pytest.fixture(scope="module")
def clone(tmp_path_factory, s3_port) -> Path:
    """A fresh clone's files, with the input files and the edited cloud profiles
    (`my-awsbatch`, against moto's server) that the docs' commands name."""
    folder = clone_of_workflow(tmp_path_factory.mktemp("clone"))
    for name in CLOUD:
        edited_cloud_profile(name, "s3://lab/esmshard", s3_port, folder / f"my-{name}")
    for name in ("proteome.fasta.gz", "a.fasta", "b.fasta"):
        subprocess.run(f"gzip -c {PROTEINS} > {name}" if name.endswith(".gz")
                       else f"cp {PROTEINS} {name}", shell=True, cwd=folder, check=True)  # fmt: skip
    subprocess.run(["cp", "-r", "profiles/slurm", "profiles/mycluster"], cwd=folder, check=True)
    s3_client(s3_port).upload_file(str(folder / "proteome.fasta.gz"), "lab",
                                   "esmshard/proteome.fasta.gz")  # fmt: skip
    header, sequence = read_records(PROTEINS)[0]  # a variant of the input's first record
    (folder / "variants.csv").write_text(f"id,mutant\n{header[1:].split()[0]},{sequence[0]}1A\n")
    example = "resources/ecoli_k12_example.fasta"  # what `make run` writes
    subprocess.run([sys.executable, "-m", "esmshard.input.datasets", "example", example], cwd=folder,
                   env={**os.environ, "ESMSHARD_DATA": str(DATA)}, check=True)  # fmt: skip
    return folder


@pytest.mark.parametrize("command", workflow_commands(), ids=repr)
def test_every_workflow_command_runs_as_a_dry_run(command, clone, tmp_path):
    argv = list(command.argv)
    # Random weights of the smallest shape instead of a download; a dry run of the rest.
    if argv[0] == "esmshard":
        argv += ["--model", f"random:{TINY_MODEL}"]
    elif "--config" in argv:
        argv.insert(argv.index("--config") + 1, f"model=random:{TINY_MODEL}")
    else:
        argv += ["--config", f"model=random:{TINY_MODEL}"]
    argv += (["--"] if argv[0] == "esmshard" else []) + ["--dry-run"]
    env = {"PATH": f"{BIN}:/usr/bin:/bin", "HOME": str(tmp_path),
           "ESMSHARD_POOL_DIR": str(tmp_path / "pool"), **S3_ENV}  # fmt: skip
    done = subprocess.run(argv, cwd=clone, env=env, capture_output=True, text=True)
    assert done.returncode == 0, f"{command}\n{done.stderr[-3000:]}"
    assert "rule shard" in done.stdout + done.stderr or "checkpoint shard" in done.stdout


def heading_anchors(page: Path) -> set[str]:
    """GitHub's anchors of a page's headings."""
    anchors = set()
    for heading in re.findall(r"^#+ (.+)$", page.read_text(), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.lower().replace("`", "")).replace(" ", "-")
        anchors.add(slug)
    return anchors


def test_no_link_is_broken():
    checked = 0
    for page in PAGES:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            if re.match(r"https?://", target):
                continue
            path, _, anchor = target.partition("#")
            linked = (page.parent / path).resolve() if path else page
            assert linked.exists(), f"{page.relative_to(REPO)}: {target} does not exist"
            if anchor:
                assert anchor in heading_anchors(linked), f"{page.relative_to(REPO)}: {target}"
            checked += 1
    assert checked > 20


def table_keys(page: Path) -> set[str]:
    """The first column's `key` of every table row of a page."""
    return set(re.findall(r"^\| `(\w+)` \|", page.read_text(), re.M))


def test_every_config_key_shown_is_one_and_the_reference_shows_them_all():
    assert table_keys(REPO / "docs" / "configuration.md") == KEYS
    assert table_keys(REPO / "config" / "README.md") == KEYS
    readme = table_keys(REPO / "README.md")
    assert len(readme) >= 8 and readme <= KEYS
