import os
import subprocess
import sys

import pytest
from helpers import small_disk

from esmshard.files import DiskFullError, atomic_path, read_tsv, write_json, write_tsv


def test_a_failed_write_leaves_neither_the_file_nor_its_temporary(tmp_path):
    target = tmp_path / "out.json"
    with pytest.raises(RuntimeError):
        with atomic_path(target) as tmp:
            tmp.write_text("half")
            raise RuntimeError("disk full")
    assert list(tmp_path.iterdir()) == []


def test_a_folder_appears_whole_over_an_older_one_or_not_at_all(tmp_path):
    target = tmp_path / "shards"
    target.mkdir()
    (target / "old.tsv").write_text("from an earlier plan")
    with atomic_path(target) as tmp:
        tmp.mkdir()
        (tmp / "new.tsv").write_text("whole")
        assert (target / "old.tsv").exists()  # the old folder stays until the new one is whole
    assert [p.name for p in target.iterdir()] == ["new.tsv"]
    with pytest.raises(RuntimeError):
        with atomic_path(tmp_path / "other") as tmp:
            tmp.mkdir()
            (tmp / "half.tsv").write_text("half")
            raise RuntimeError("killed")
    assert [p.name for p in tmp_path.iterdir()] == ["shards"]


def test_temporary_names_belong_to_their_writer(tmp_path):
    with atomic_path(tmp_path / "x") as tmp:
        assert str(os.getpid()) in tmp.name and tmp.parent == tmp_path
        tmp.write_text("whole")
    assert (tmp_path / "x").read_text() == "whole"


def test_tsv_and_json_round_trip(tmp_path):
    write_tsv(tmp_path / "t.tsv", ["a", "b"], [[1, "x\ty"], [2, "z"]])
    assert read_tsv(tmp_path / "t.tsv") == [{"a": "1", "b": "x\ty"}, {"a": "2", "b": "z"}]
    write_json(tmp_path / "m.json", {"k": 1})
    assert (tmp_path / "m.json").read_text() == '{\n  "k": 1\n}\n'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.json", "t.tsv"]


def test_a_disk_that_fills_while_hdf5_writes_is_named_in_the_log_without_a_crash(tmp_path):
    """Past the up-front check (another writer took the space): the error, not a SIGSEGV."""
    with small_disk(tmp_path / "disk", 4) as disk:
        script = (
            "import h5py, numpy as np\n"
            "from esmshard.steps.job import run_step\n"
            "from esmshard.files import atomic_path\n"
            "def write(path):\n"
            "    with atomic_path(path) as tmp, h5py.File(tmp, 'w') as h5:\n"
            "        rows = h5.create_dataset('x', (0, 1000), np.float32, maxshape=(None, 1000), chunks=True)\n"
            "        for start in range(0, 2000, 100):  # appended as the shard writer does\n"
            "            rows.resize(start + 100, axis=0)\n"
            "            rows[start:] = np.ones((100, 1000), np.float32)\n"
            f"run_step({str(tmp_path / 'job.log')!r}, write, path={str(disk / 'out.h5')!r})\n"
        )
        job = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
        assert job.returncode == 1, job.stderr
        log = (tmp_path / "job.log").read_text()
        assert f"ERROR esmshard: no space left for {disk / 'out.h5'}: it needs more space" in log
        assert "run the same command again" in job.stderr
        assert "Exception ignored" not in job.stderr  # HDF5's clean-up noise stays in the log
        assert os.listdir(disk) == []


def test_an_output_that_cannot_fit_is_refused_before_writing(tmp_path):
    with small_disk(tmp_path / "disk", 1) as disk:
        with pytest.raises(DiskFullError, match=r"it needs about 2\.0 MB and .* are free"):
            with atomic_path(disk / "big.h5", needed_bytes=2_000_000):
                raise AssertionError("not reached")
        assert os.listdir(disk) == []
