import os
import shutil

from esmshard.store import checksums


def test_content_is_hashed_once_per_file_version(tmp_path, monkeypatch):
    data, cache = tmp_path / "in.fa", tmp_path / "cache.json"
    data.write_text(">a\nMKV\n")
    first = checksums.file_checksums([data], cache)
    assert first == [checksums.sha256(data)]

    hashed = []
    monkeypatch.setattr(checksums, "sha256", lambda p: hashed.append(p) or "new")
    assert checksums.file_checksums([data], cache) == first and hashed == []  # a stat sufficed

    # Other content under the old modification time: ctime and inode give it away.
    stamp = data.stat().st_mtime_ns
    other = tmp_path / "other.fa"
    other.write_text(">b\nMKW\n")
    shutil.copy(other, data)
    os.utime(data, ns=(stamp, stamp))
    assert checksums.file_checksums([data], cache) == ["new"] and hashed == [data]
