"""An object read as a file by ranged requests: h5py reads an HDF5 file in a bucket as it reads
it on disk, fetching only the blocks it needs (against moto's S3 server)."""

import h5py
import numpy as np
import pytest
from helpers import S3_ENV, Proxy, s3_client

from esmshard.store import object_file as module
from esmshard.store.object_file import object_file


@pytest.fixture(autouse=True)
def server(port, monkeypatch):
    for name, value in {**S3_ENV, "AWS_ENDPOINT_URL_S3": f"http://127.0.0.1:{port}"}.items():
        monkeypatch.setenv(name, value)


def test_h5py_reads_one_row_of_a_large_file_in_a_few_blocks(port, tmp_path):
    rows = np.random.default_rng(0).standard_normal((4000, 1000)).astype(np.float32)  # 16 MB
    with h5py.File(tmp_path / "big.h5", "w") as h5:
        h5.create_dataset("values", data=rows)
        h5.attrs["note"] = "whole"
    s3_client(port).upload_file(str(tmp_path / "big.h5"), "lab", "runs/big.h5")
    found = object_file("s3://lab/runs/big.h5")
    assert found.size == (tmp_path / "big.h5").stat().st_size
    with h5py.File(found, "r") as h5:
        np.testing.assert_array_equal(h5["values"][2500], rows[2500])
        assert h5.attrs["note"] == "whole"
    assert found.fetched <= 3 * module.BLOCK and found.requests <= 3
    with h5py.File(found, "r") as h5:  # every row: one request a run of blocks not yet held
        np.testing.assert_array_equal(h5["values"][:], rows)
    assert found.fetched <= found.size + 3 * module.BLOCK


def test_reads_across_blocks_and_past_the_end_give_the_bytes_of_the_file(port):
    data = bytes(range(256)) * (3 * module.BLOCK // 256 + 7)
    s3_client(port).put_object(Bucket="lab", Key="bytes", Body=data)
    found = object_file("s3://lab/bytes")
    found.seek(module.BLOCK - 5)
    assert found.read(10) == data[module.BLOCK - 5 : module.BLOCK + 5]
    found.seek(-3, 2)
    assert found.read(100) == data[-3:] and found.read(1) == b""
    found.seek(0)
    assert found.read() == data


def test_an_object_that_is_not_there_is_not_found():
    with pytest.raises(FileNotFoundError, match="s3://lab/none.h5 is not in the object store"):
        object_file("s3://lab/none.h5")


def test_a_server_named_after_the_first_read_is_the_one_reached(port, monkeypatch):
    s3_client(port).put_object(Bucket="lab", Key="moved", Body=b"same bytes")
    assert object_file("s3://lab/moved").read() == b"same bytes"
    other = Proxy(port)
    try:
        monkeypatch.setenv("AWS_ENDPOINT_URL_S3", f"http://127.0.0.1:{other.port}")
        assert object_file("s3://lab/moved").read() == b"same bytes"
        assert other.requests >= 2  # the HEAD and the GET went to the server now named
    finally:
        other.stop()
