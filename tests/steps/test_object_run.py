"""Where a run in object storage keeps its store, and what refuses it before any job."""

import pytest

from esmshard.steps.invocation import Invocation, StartRefused
from esmshard.steps.object_run import run_object_store

S3 = Invocation(
    storage_provider="s3", storage_prefix="s3://lab/runs/", storage_endpoint="http://e"
)
CONFIG = {"outdir": "out", "store": "", "output_values": "auto"}


def test_the_store_is_under_the_runs_outdir_or_where_it_is_given():
    assert run_object_store(S3, CONFIG).url == "s3://lab/runs/out/store"
    assert run_object_store(S3, {**CONFIG, "outdir": "a/../b"}).url == "s3://lab/runs/b/store"
    given = run_object_store(S3, {**CONFIG, "store": "s3://shared/store"})
    assert (given.url, given.endpoint_url) == ("s3://shared/store", "http://e")
    assert run_object_store(Invocation(), CONFIG) is None


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
        (S3, {**CONFIG, "output_values": "in_place"},
         "output_values: in_place reads the store's parts where they lie"),
    ],
)  # fmt: skip
def test_what_cannot_work_is_refused_in_one_line(invocation, config, said):
    with pytest.raises(StartRefused) as refused:
        run_object_store(invocation, config)
    (problem,) = refused.value.problems
    assert problem.startswith(said), problem
