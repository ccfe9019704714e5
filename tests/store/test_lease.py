"""One run at a time in an outdir in object storage: the lease, taken, renewed, refused to a
second run in one line, taken over once its holder is gone (against moto's S3 server)."""

import json
import os
import subprocess
import sys
import time

import pytest
from helpers import S3_ENV, s3_client

from esmshard.store.lease import Lease
from esmshard.store.objects import Bucket, ObjectStore
from esmshard.store.runlock import RunActiveError


@pytest.fixture
def bucket(port, monkeypatch, request):
    for name, value in S3_ENV.items():
        monkeypatch.setenv(name, value)
    return Bucket(ObjectStore(f"s3://lab/{request.node.name}", f"http://127.0.0.1:{port}"))


def lease(bucket, **timing) -> Lease:
    return Lease(bucket, "out/.esmshard/run.lease", "s3://lab/x/out", **timing)


def record(bucket) -> dict:
    return json.loads(bucket.read("out/.esmshard/run.lease"))


def test_a_second_run_is_refused_in_one_line_naming_the_holder(bucket):
    first = lease(bucket)
    taken = first.take()
    assert record(bucket)["run_id"] == taken["run_id"] and record(bucket)["pid"] == os.getpid()
    second = lease(bucket)
    line = second.problem()
    assert line.startswith("another esmshard run is active in s3://lab/x/out: the run of "
                           f"process {os.getpid()} on host ")  # fmt: skip
    assert "\n" not in line and "renewed 0 s ago" in line
    with pytest.raises(RunActiveError, match="another esmshard run is active in s3://lab/x/out"):
        second.take()
    first.release()
    assert bucket.size("out/.esmshard/run.lease") is None
    assert second.problem() is None
    second.take()
    second.release()


def test_the_holder_renews_it_and_a_lease_left_unrenewed_is_taken_over(bucket):
    held = lease(bucket, renew=0.2)
    held.take()
    time.sleep(2.5)
    assert held.holder()[2] <= 1  # renewed (the server's clock counts whole seconds)
    held.stopped.set()  # its holder hangs: no more renewals, the lease stays
    time.sleep(0.3)
    said = []
    late = lease(bucket, expires=1.0)
    with pytest.raises(RunActiveError):
        late.take(said.append)  # renewed within the second
    time.sleep(2.1)  # the server's clock counts whole seconds
    assert late.problem() is None
    late.take(said.append)
    assert said and said[0].startswith("esmshard: took over the lease of a run that is gone")
    held.release()  # the old holder's release removes nothing that is not its own
    assert record(bucket)["run_id"] == late.record["run_id"]
    late.release()


def test_a_holder_on_this_host_whose_process_is_gone_is_taken_over_at_once(bucket):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    held = lease(bucket)
    held.take()
    held.stopped.set()
    body = {**record(bucket), "pid": int(dead.stdout)}
    s3_client(int(bucket.where.endpoint_url.rsplit(":", 1)[1])).put_object(
        Bucket="lab", Key=bucket.where.key("out/.esmshard/run.lease"), Body=json.dumps(body)
    )
    assert lease(bucket).problem() is None
    after = lease(bucket)
    after.take()
    after.release()
