"""A job's copy of part of an object store: what it fetches, and what it sends back."""

import pytest
from helpers import S3_ENV, Flaky, s3_client

from esmshard.files import writer_suffix
from esmshard.store.location import OBJECT_STORE_ENV, Location
from esmshard.store.mirror import Mirror, mirrored
from esmshard.store.objects import Bucket, ObjectStore


@pytest.fixture
def where(port, monkeypatch, request):
    for name, value in S3_ENV.items():
        monkeypatch.setenv(name, value)
    location = ObjectStore(f"s3://lab/{request.node.name}", f"http://127.0.0.1:{port}")
    monkeypatch.setenv(OBJECT_STORE_ENV, "")  # restored after the test
    Location(location, "s3://lab").hand_to_jobs()
    return location


def put(where, files: dict[str, bytes]) -> None:
    for relative, body in files.items():
        s3_client(int(where.endpoint_url.rsplit(":", 1)[1])).put_object(
            Bucket="lab", Key=where.key(relative), Body=body
        )


def test_only_the_scope_is_fetched(where, tmp_path):
    put(where, {"key/a.h5": b"a", "key/a.json": b"{}", "other/b.h5": b"b",
                ".compiled/layer": b"c", "key/.pieces/s1/00001.h5": b"p"})  # fmt: skip
    mirror = Mirror(where, tmp_path, ("key/",))
    assert mirror.pull(skip=lambda relative: "/.pieces/" in relative) == 2
    found = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file())
    assert found == ["key/a.h5", "key/a.json"]


def test_what_the_step_adds_changes_and_removes_is_sent_back(where, tmp_path):
    put(where, {"key/old.h5": b"old", "key/old.json": b"{}", "key/settings.json": b"{}"})
    mirror = Mirror(where, tmp_path, ("key/",))
    mirror.pull()
    (tmp_path / "key" / "new.json").write_text('{"n": 1}')
    (tmp_path / "key" / "new.h5").write_bytes(b"new")
    (tmp_path / "key" / "settings.json").write_text('{"changed": true}')
    (tmp_path / "key" / "old.h5").rename(tmp_path / "key" / "old.h5.corrupt")  # set aside
    (tmp_path / "key" / f".x.h5{writer_suffix()}").write_bytes(b"half")  # a temporary
    (tmp_path / "elsewhere.h5").write_bytes(b"out of scope")
    mirror.push()
    bucket = Bucket(where)
    assert bucket.listing() == {
        "key/new.h5": 3, "key/new.json": 8, "key/old.h5.corrupt": 3, "key/old.json": 2,
        "key/settings.json": 17,
    }  # fmt: skip
    assert bucket.read("key/settings.json") == b'{"changed": true}'


def test_a_part_another_run_put_first_stays(where, tmp_path):
    mirror = Mirror(where, tmp_path, ("key/",))
    mirror.pull()
    put(where, {"key/p.h5": b"theirs"})
    (tmp_path / "key").mkdir()
    (tmp_path / "key" / "p.h5").write_bytes(b"mine")
    mirror.push()
    assert Bucket(where).read("key/p.h5") == b"theirs"


def test_a_failed_step_still_sends_back_what_it_kept(where, tmp_path):
    with pytest.raises(RuntimeError), mirrored(tmp_path, ("key/",)) as mirror:
        assert mirror is not None
        (tmp_path / "key").mkdir()
        (tmp_path / "key" / "piece.json").write_text("{}")
        raise RuntimeError("the step failed")
    assert Bucket(where).listing() == {"key/piece.json": 2}


def test_a_folder_store_has_no_mirror(tmp_path, monkeypatch):
    monkeypatch.delenv(OBJECT_STORE_ENV, raising=False)
    with mirrored(tmp_path, ("key/",)) as mirror:
        assert mirror is None


def test_requests_retried_are_counted_in_the_steps_line(where, port, tmp_path):
    put(where, {"key/a.json": b"{}", "key/b.json": b"[]"})
    flaky = Flaky(port)
    mirror = Mirror(ObjectStore(where.url, flaky.url), tmp_path, ("key/",))
    assert mirror.pull() == 2
    assert mirror.moved_line().startswith("store copy: 2 of 2 files fetched, 4 bytes; ")
    assert mirror.moved_line().endswith(" requests retried (throttled or dropped)")
    flaky.shutdown()
