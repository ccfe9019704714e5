import subprocess
import sys

from helpers import PROTEOME, REPO, read_records

from esmshard.input import datasets


def test_example_is_every_15th_record_byte_for_byte(tmp_path):
    target = tmp_path / "example.fasta"
    datasets.write_every_nth_record(PROTEOME, target, 15)
    records = read_records(target)
    assert len(records) == 291 and records == read_records(PROTEOME)[::15]
    chunks = [">" + chunk for chunk in PROTEOME.read_text().split("\n>")]  # each record as written
    chunks[0] = chunks[0][1:]
    assert target.read_text() == "\n".join(chunks[::15]).rstrip("\n") + "\n"


def test_shared_data_is_used_where_it_lies(tmp_path):
    assert datasets.fetch_test_data(tmp_path) == datasets.shared_data_dir()
    assert list(tmp_path.iterdir()) == []


def test_missing_test_data_names_every_file_offline(tmp_path):
    env = {"ESMSHARD_DATA": str(tmp_path / "none"), "https_proxy": "http://127.0.0.1:9",
           "PATH": "/usr/bin"}  # fmt: skip
    result = subprocess.run(
        [sys.executable, "-m", "esmshard.input.datasets", "test-data", str(tmp_path / "cache")],
        cwd=REPO, env=env, capture_output=True, text=True,
    )  # fmt: skip
    assert result.returncode == 1
    n = len(datasets.TEST_DATA)
    assert f"{n} of the {n} test files cannot be had" in result.stderr
    for dataset in datasets.TEST_DATA:
        assert f"put {dataset.name} into {tmp_path / 'cache'}" in result.stderr


def test_offline_download_says_where_to_put_the_file(tmp_path):
    env = {
        "ESMSHARD_DATA": str(tmp_path / "none"),
        "https_proxy": "http://127.0.0.1:9",
        "PATH": "/usr/bin",
    }
    result = subprocess.run(
        [sys.executable, "-m", "esmshard.input.datasets", "example", str(tmp_path / "cache" / "example.fasta")],
        cwd=REPO, env=env, capture_output=True, text=True,
    )  # fmt: skip
    assert result.returncode == 1
    assert (
        "cannot download ecoli_k12_UP000000625.fasta from https://rest.uniprot.org/"
        in result.stderr
    )
    assert f"put ecoli_k12_UP000000625.fasta into {tmp_path / 'cache'}" in result.stderr
    assert not list((tmp_path / "cache").iterdir())  # no partial download left
