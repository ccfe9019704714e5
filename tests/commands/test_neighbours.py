"""`esmshard neighbours` as its users type it: every query's k neighbours equal numpy's exact
search, annotations carried over with their reliability index, bad input said in one line."""

import csv
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import MODEL, SLICE, TINY_MODEL, doc_block

import esmshard
from esmshard.outputs.reader import Embeddings

BIN = Path(sys.executable).parent


def esmshard_command(*args) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "esmshard"), *map(str, args)], capture_output=True,
                          text=True)  # fmt: skip


def read(path) -> list[dict]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh, delimiter="\t"))


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    folder = tmp_path_factory.mktemp("neighbours")
    store = folder / "store"
    reference = dict((h[1:].split()[0], s) for h, s in SLICE[:60])
    queries = dict((h[1:].split()[0], s) for h, s in SLICE[54:66])
    esmshard.embed(reference, MODEL, store=store).save(folder / "reference")
    esmshard.embed(queries, MODEL, store=store).save(folder / "queries")
    ids = list(reference)
    (folder / "go.csv").write_text(
        "id,go_terms,name\n"
        + "".join(f"{i},GO:{n:07d},protein {n}\n" for n, i in enumerate(ids[::3]))
        + "absent1,GO:1,x\nabsent2,GO:2,y\n"
    )
    return folder


def exact(queries: np.ndarray, reference: np.ndarray) -> np.ndarray:
    q, r = queries.astype(np.float64), reference.astype(np.float64)
    return np.sqrt(((q[:, None] - r[None]) ** 2).sum(-1))


def test_every_querys_neighbours_equal_numpys_exact_search(saved, tmp_path):
    out = tmp_path / "neighbours.tsv"
    done = esmshard_command("neighbours", saved / "queries", "--reference", saved / "reference",
                            "-k", 5, "-o", out, "--annotations", saved / "go.csv")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines() == [
        f"esmshard neighbours: 2 of the 22 IDs of {saved / 'go.csv'} are not in "
        f"{saved / 'reference'} (e.g. absent1): they carry nothing over",
        f"esmshard neighbours: wrote {out} and {tmp_path / 'neighbours.annotations.tsv'}",
    ]
    with Embeddings(saved / "queries") as q, Embeddings(saved / "reference") as r:
        distances = exact(q.array("mean"), r.array("mean"))
        query_ids, reference_ids = q.ids(), r.ids()
    rows = read(out)
    assert len(rows) == 5 * len(query_ids)
    with open(saved / "go.csv", newline="") as fh:
        annotated = {row["id"]: row for row in csv.DictReader(fh)}
    for n, query in enumerate(query_ids):
        mine = [row for row in rows if row["id"] == query]
        order = np.argsort(distances[n], kind="stable")[:5]
        assert [row["neighbour"] for row in mine] == [reference_ids[i] for i in order]
        assert [int(row["rank"]) for row in mine] == [1, 2, 3, 4, 5]
        np.testing.assert_allclose([float(row["distance"]) for row in mine],
                                   distances[n][order], rtol=1e-5)  # fmt: skip
        for row in mine:
            expected = annotated.get(row["neighbour"], {"go_terms": "", "name": ""})
            assert (row["go_terms"], row["name"]) == (expected["go_terms"], expected["name"])
    transfer = {row["id"]: row for row in read(tmp_path / "neighbours.annotations.tsv")}
    for n, query in enumerate(query_ids):
        order = np.argsort(distances[n], kind="stable")[:5]
        nearest = next((reference_ids[i] for i in order if reference_ids[i] in annotated), "")
        assert transfer[query]["neighbour"] == nearest
        if nearest:
            d = float(transfer[query]["distance"])
            ri = float(transfer[query]["reliability_index"])
            assert ri == pytest.approx(0.5 / (0.5 + d), abs=1e-6)  # written to 6 decimals
            assert transfer[query]["go_terms"] == annotated[nearest]["go_terms"]


def test_a_reference_against_itself_leaves_each_own_row_out(saved, tmp_path):
    out = tmp_path / "self.tsv"
    done = esmshard_command("neighbours", saved / "reference", "--reference",
                            saved / "reference" / "embeddings.h5", "-k", 2, "-o", out)  # fmt: skip
    assert done.returncode == 0, done.stderr
    rows = read(out)
    assert len(rows) == 2 * 60 and not [r for r in rows if r["id"] == r["neighbour"]]


def test_k_past_the_reference_is_said(saved, tmp_path):
    out = tmp_path / "all.tsv"
    done = esmshard_command("neighbours", saved / "queries", "--reference", saved / "queries",
                            "-k", 50, "-o", out)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines()[0] == (
        f"esmshard neighbours: -k 50 asks for more than {saved / 'queries' / 'embeddings.h5'} "
        "holds: each query gets 11 neighbours"
    )
    assert len(read(out)) == 12 * 11


def test_a_reference_of_another_model_is_refused_in_one_line(saved, tmp_path):
    other = tmp_path / "other"
    esmshard.embed({"a": "MKTAYIAKQR"}, f"random:{TINY_MODEL}", store=tmp_path / "s").save(other)
    done = esmshard_command("neighbours", saved / "queries", "--reference", other,
                            "-o", tmp_path / "x.tsv")  # fmt: skip
    assert done.returncode == 1
    (line,) = done.stderr.splitlines()
    assert line.startswith(
        f"esmshard neighbours: {saved / 'queries' / 'embeddings.h5'} and "
        f"{other / 'embeddings.h5'} were embedded with other models ("
    )
    assert line.endswith("): embed both with the same model")
    assert not (tmp_path / "x.tsv").exists()


def test_the_docs_command_runs_as_shown(saved, tmp_path):
    """docs/outputs.md's command, typed in a folder holding what it names."""
    line = doc_block("docs/outputs.md", "## Nearest neighbours").strip()
    (tmp_path / "results").symlink_to(saved / "queries")
    (tmp_path / "swissprot-run").mkdir()
    (tmp_path / "swissprot-run" / "results").symlink_to(saved / "reference")
    (tmp_path / "swissprot-go.tsv").write_text((saved / "go.csv").read_text().replace(",", "\t"))
    argv = shlex.split(line)
    done = subprocess.run([str(BIN / argv[0]), *argv[1:]], cwd=tmp_path, capture_output=True,
                          text=True)  # fmt: skip
    assert done.returncode == 0, done.stderr
    rows = read(tmp_path / "neighbours.tsv")
    assert len(rows) == 10 * 12 and rows[0].keys() >= {"go_terms", "name"}
    transfer = read(tmp_path / "neighbours.annotations.tsv")
    assert len(transfer) == 12 and all(0 < float(t["reliability_index"]) <= 1 for t in transfer)
