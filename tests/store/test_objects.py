"""esmshard's own access to an object store: locations, whole objects, written-once parts, and
the one line that says why a store cannot be used (against moto's S3 server)."""

import pytest
from helpers import S3_ENV, Flaky, free_port

from esmshard.store.objects import Bucket, ObjectStore, ObjectStoreError, check_writable


@pytest.fixture(autouse=True)
def credentials(monkeypatch):
    for name, value in S3_ENV.items():
        monkeypatch.setenv(name, value)


def test_a_location_names_its_bucket_and_its_keys():
    where = ObjectStore("s3://lab/runs/one/store/", "http://127.0.0.1:1")
    assert (where.bucket, where.prefix) == ("lab", "runs/one/store")
    assert where.key("abc/part.h5") == "runs/one/store/abc/part.h5"
    assert ObjectStore("s3://lab").key("x") == "x"


def test_a_part_is_written_once_and_the_first_stays(port, tmp_path):
    bucket = Bucket(ObjectStore("s3://lab/once", f"http://127.0.0.1:{port}"))
    first, second = tmp_path / "first", tmp_path / "second"
    first.write_bytes(b"first")
    second.write_bytes(b"second")
    assert bucket.upload(first, "k/part.h5", only_new=True)
    assert not bucket.upload(second, "k/part.h5", only_new=True)
    assert bucket.read("k/part.h5") == b"first"
    assert bucket.listing("k/") == {"k/part.h5": 5}
    assert bucket.size("k/part.h5") == 5 and bucket.size("k/none") is None
    bucket.download("k/part.h5", tmp_path / "back" / "part.h5")
    assert (tmp_path / "back" / "part.h5").read_bytes() == b"first"
    assert [p.name for p in (tmp_path / "back").iterdir()] == ["part.h5"]  # no temporary left
    bucket.delete("k/part.h5")
    assert bucket.listing("k/") == {}


def test_an_unreachable_server_is_one_line():
    port = free_port()
    with pytest.raises(ObjectStoreError) as err:
        check_writable(ObjectStore("s3://lab/x", f"http://127.0.0.1:{port}"))
    assert str(err.value) == (
        f"s3://lab/x: cannot reach the object store at http://127.0.0.1:{port}: check the "
        "address (--storage-s3-endpoint-url) and that the server is up"
    )


def test_a_missing_bucket_is_one_line(port):
    with pytest.raises(ObjectStoreError) as err:
        Bucket(ObjectStore("s3://nolab/x", f"http://127.0.0.1:{port}")).listing()
    assert str(err.value) == (
        f"s3://nolab/x: bucket 'nolab' does not exist at http://127.0.0.1:{port}: create it first"
    )


def test_missing_credentials_are_one_line(port, monkeypatch, tmp_path):
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    with pytest.raises(ObjectStoreError) as err:
        check_writable(ObjectStore("s3://lab/x", f"http://127.0.0.1:{port}"))
    assert str(err.value).startswith("s3://lab/x: no credentials for the object store: set ")


@pytest.mark.parametrize("drop", [False, True], ids=["503 SlowDown", "dropped connections"])
def test_throttling_and_dropped_connections_are_retried_and_counted(port, tmp_path, drop):
    flaky = Flaky(port, drop)
    bucket = Bucket(ObjectStore(f"s3://lab/flaky{drop}", flaky.url))
    (tmp_path / "part.h5").write_bytes(b"values")
    for n in range(4):
        assert bucket.upload(tmp_path / "part.h5", f"k/{n}.h5", only_new=True)
    assert bucket.listing("k/") == {f"k/{n}.h5": 6 for n in range(4)}
    assert bucket.read("k/2.h5") == b"values" and bucket.head("k/3.h5").size == 6
    assert bucket.retried >= 6 and flaky.seen >= 12  # half the requests failed, all were retried
    flaky.shutdown()
