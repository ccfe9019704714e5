"""The public data sets behind `make run`'s example and the test suite: found or fetched, never shipped.

They are third-party files, so the repository holds none of them. Each is looked for in a data
folder beside the checkout (`../shared/data`, or `ESMSHARD_DATA`), then in a cache folder, and
otherwise downloaded from its public source into that cache and checked against its hash.

    python -m esmshard.input.datasets example resources/ecoli_k12_example.fasta
    python -m esmshard.input.datasets test-data resources/test-data
"""

import argparse
import gzip
import hashlib
import os
import shutil
import sys
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from ..files import atomic_path

REPO = Path(__file__).resolve().parents[2]
DOWNLOAD_TIMEOUT_SECONDS = 60


@dataclass(frozen=True)
class Dataset:
    name: str  # file name in the data folder
    url: str
    sha256_prefix: str | None  # of the file as used (after gunzip); None where the source changes
    gzipped: bool = False


def _github(repo: str, commit: str, path: str) -> str:
    return f"https://raw.githubusercontent.com/{repo}/{commit}/{path}"


BIOPYTHON = ("biopython/biopython", "8b4d499f0e42567439e18a44986f342cc46e4faa")
# The files the tests read, at the commits listed in ../shared/data/SOURCES.md.
TEST_DATA = [
    Dataset(
        "ecoli_k12_UP000000625.fasta",
        _github(
            "skinnider/CFdb-searches",
            "1f84d40a997bfa8d8808a4e5cab9c201422976f3",
            "data/fasta/filtered/UP000000625-E.coli.fasta.gz",
        ),
        "f8878198b8798e87",
        gzipped=True,
    ),
    Dataset(
        "r1ab_sars2.fasta",
        _github(
            "slegare2/findallsegments",
            "2cb4b97025e2b8e8d3ad0a73c6aa629143401925",
            "sequences/r1ab_sars2.fasta",
        ),
        "9a11122488b6e844",
    ),
    Dataset(
        "dram_camper_test_genes.faa",
        _github(
            "WrightonLabCSU/DRAM",
            "fe61d759303f30db058d5d505c448b28e41b03f1",
            "tests/data/camper_test_genes.faa",
        ),
        "840e6f190230602c",
    ),
    Dataset(
        "biopython_fa01_aligned.fasta", _github(*BIOPYTHON, "Tests/Fasta/fa01"), "bec719952783c007"
    ),
    Dataset(
        "yersinia_pestis_pMT1_NC_005816_genes.ffn",
        _github(*BIOPYTHON, "Tests/GenBank/NC_005816.ffn"),
        "c421731520a56fc3",
    ),
]
# `make run`'s example: the E. coli K-12 reference proteome as UniProt serves it today.
UNIPROT_PROTEOME = Dataset(
    "ecoli_k12_UP000000625.fasta",
    "https://rest.uniprot.org/uniprotkb/stream?compressed=true&format=fasta&query=%28proteome%3AUP000000625%29",
    None,
    gzipped=True,
)
EXAMPLE_EVERY = 15  # every 15th record: 291 proteins of the shared proteome


class DatasetError(RuntimeError):
    """A data set that is neither beside the checkout nor downloadable; the message says what to do."""


def shared_data_dir() -> Path:
    return Path(os.environ.get("ESMSHARD_DATA") or REPO.parent / "shared" / "data")


def _sha256_prefix(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()[:16]


def _download(dataset: Dataset, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(target) as tmp:
        try:
            with (
                urllib.request.urlopen(dataset.url, timeout=DOWNLOAD_TIMEOUT_SECONDS) as response,
                open(tmp, "wb") as out,
            ):
                stream = gzip.GzipFile(fileobj=response) if dataset.gzipped else response
                shutil.copyfileobj(stream, out)
        except OSError as err:  # URLError, timeouts, broken streams: the same advice
            raise DatasetError(
                f"cannot download {dataset.name} from {dataset.url} ({err}). Without network access, "
                f"put {dataset.name} into {target.parent} (or its data folder beside the checkout, "
                f"{shared_data_dir()})"
            ) from err
        if dataset.sha256_prefix and _sha256_prefix(tmp) != dataset.sha256_prefix:
            raise DatasetError(
                f"{dataset.url} did not give the expected {dataset.name} (sha256 differs)"
            )


def locate(dataset: Dataset, cache_dir: Path) -> Path:
    """The data set's file: beside the checkout, in the cache, or downloaded into the cache."""
    for folder in (shared_data_dir(), cache_dir):
        if (folder / dataset.name).is_file():
            return folder / dataset.name
    _download(dataset, cache_dir / dataset.name)
    return cache_dir / dataset.name


def fetch_test_data(cache_dir: Path) -> Path:
    """The folder holding every file the tests read (the shared one where it is complete)."""
    if all((shared_data_dir() / d.name).is_file() for d in TEST_DATA):
        return shared_data_dir()
    problems = []  # every file that cannot be had, not the first alone
    for dataset in TEST_DATA:
        try:
            locate(dataset, cache_dir)
        except DatasetError as err:
            problems.append(f"- {err}")
    if problems:
        raise DatasetError(
            f"{len(problems)} of the {len(TEST_DATA)} test files cannot be had (they are read "
            f"from {shared_data_dir()} where it holds them all):\n" + "\n".join(problems)
        )
    return cache_dir


def write_every_nth_record(source: Path, target: Path, every: int) -> None:
    """Records 0, n, 2n, ... of `source`, byte for byte."""
    with open(source) as fh, atomic_path(target) as tmp, open(tmp, "w") as out:
        index = -1
        for line in fh:
            if line.startswith(">"):
                index += 1
            if index % every == 0:
                out.write(line)


def make_example(target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    proteome = locate(UNIPROT_PROTEOME, target.parent)
    write_every_nth_record(proteome, target, EXAMPLE_EVERY)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m esmshard.input.datasets", description=__doc__.split("\n")[0]
    )
    parser.add_argument("what", choices=["example", "test-data"])
    parser.add_argument(
        "path", type=Path, help="the example FASTA to write, or the test data cache folder"
    )
    args = parser.parse_args(argv)
    try:
        if args.what == "example":
            make_example(args.path)
        else:
            print(f"test data: {fetch_test_data(args.path)}")
    except DatasetError as err:
        print(f"esmshard: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
