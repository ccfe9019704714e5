"""Where a run's files live, decided once (esmshard.store.location): folders, or object storage
with its store there, and what refuses it before any job; its jobs find the same decision; no
other module decides."""

import re

import pytest
from helpers import REPO

from esmshard.steps.invocation import Invocation
from esmshard.store.location import OBJECT_STORE_ENV, Location, LocationRefused

S3 = Invocation(
    storage_provider="s3", storage_prefix="s3://lab/runs/", storage_endpoint="http://e"
)
CONFIG = {"outdir": "out", "store": "", "output_values": "auto"}


def test_the_store_is_under_the_runs_outdir_or_where_it_is_given():
    assert Location.of_run(S3, CONFIG).store.url == "s3://lab/runs/out/store"
    assert Location.of_run(S3, {**CONFIG, "outdir": "a/../b"}).store.url == "s3://lab/runs/b/store"
    given = Location.of_run(S3, {**CONFIG, "store": "s3://shared/store"})
    assert (given.store.url, given.store.endpoint_url) == ("s3://shared/store", "http://e")
    assert given.url("out/run.json") == "s3://lab/runs/out/run.json"
    assert not Location.of_run(Invocation(), CONFIG).in_objects
    assert Location().url("out/run.json") == "out/run.json"


def test_jobs_find_the_runs_decision(monkeypatch):
    monkeypatch.setenv(OBJECT_STORE_ENV, "")  # what hand_to_jobs sets is restored after
    assert Location.of_job() == Location()
    decided = Location.of_run(S3, CONFIG)
    decided.hand_to_jobs()
    assert Location.of_job() == decided


# The ways a module could decide for itself: the command's storage option, the jobs'
# environment, a URL's scheme.
DECIDING = re.compile(
    r'storage_provider\b|OBJECT_STORE_ENV|ESMSHARD_OBJECT_STORE|from_env\(|"://" in'
)
# What reads them where it should: the command line as Snakemake parsed it, and the one test of
# a path given to a command (esmshard.files.is_object_url).
ALLOWED = {"esmshard/steps/invocation.py": "storage_provider", "esmshard/files.py": '"://" in'}


def test_no_other_module_decides_where_a_runs_files_live():
    sources = [*REPO.glob("esmshard/**/*.py"), *REPO.glob("workflow/**/*.smk"),
               REPO / "workflow" / "Snakefile"]  # fmt: skip
    decider = REPO / "esmshard" / "store" / "location.py"
    found = [
        f"{path.relative_to(REPO)}:{number}: {line.strip()}"
        for path in sources
        if path != decider
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if DECIDING.search(line)
        and ALLOWED.get(path.relative_to(REPO).as_posix(), "\0") not in line
    ]
    assert len(sources) > 100 and not found, found


@pytest.mark.parametrize(
    "invocation, config, said",
    [
        (Invocation(), {**CONFIG, "store": "s3://lab/store"},
         "store s3://lab/store is in object storage: run with --default-storage-provider s3"),
        (Invocation(storage_provider="gcs"), CONFIG,
         "--default-storage-provider gcs: esmshard keeps its store through the S3 protocol"),
        (S3, {**CONFIG, "outdir": "/data/out"},
         "outdir /data/out is a folder of this machine, which jobs that share no filesystem"),
        (S3, {**CONFIG, "store": "/lab/store"},
         "store /lab/store is a folder of this machine, which jobs that share no filesystem"),
    ],
)  # fmt: skip
def test_what_cannot_work_is_refused_in_one_line(invocation, config, said):
    with pytest.raises(LocationRefused) as refused:
        Location.of_run(invocation, config)
    (problem,) = refused.value.args
    assert problem.startswith(said), problem
