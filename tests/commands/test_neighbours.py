"""`esmshard neighbours` as its users type it: every query's k neighbours equal numpy's exact
search, annotations carried over with their reliability index, bad input said in one line."""

import csv
import re
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import MODEL, SLICE, TINY_MODEL, doc_block

import esmshard
from esmshard.commands import cli
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


def typed(capsys, *args) -> tuple[int, list[str]]:
    """`esmshard ARGS` in this process (cli.main, as the console script calls it): its exit
    status and its lines on stderr."""
    try:
        status = cli.main([str(a) for a in args])
    except SystemExit as stop:
        status = stop.code
    return status, capsys.readouterr().err.splitlines()


@pytest.fixture
def typed_in(saved, tmp_path, monkeypatch, capsys):
    """`esmshard neighbours ...` typed in a folder holding `queries/`, `ref/` and `ec.tsv`."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "queries").symlink_to(saved / "queries")
    (tmp_path / "ref").mkdir()
    (tmp_path / "ref" / "embeddings.h5").write_bytes(
        (saved / "reference" / "embeddings.h5").read_bytes()
    )
    (tmp_path / "ec.tsv").write_text((saved / "go.csv").read_text().replace(",", "\t"))
    return lambda *args: typed(capsys, "neighbours", *args)


@pytest.mark.parametrize(
    "args, said",
    [
        (["-o", "ec.tsv", "--annotations", "ec.tsv"],
         "-o ec.tsv is also --annotations's file: choose another path for -o"),
        (["-o", "ref/embeddings.h5"],
         "-o ref/embeddings.h5 is also --reference's file: choose another path for -o"),
        (["-o", "n.tsv", "--annotations", "ec.tsv", "--transferred", "n.tsv"],
         "--transferred n.tsv is also -o's file: choose another path for --transferred"),
        (["-o", "nowhere/deeper/n.tsv"],
         "-o nowhere/deeper/n.tsv: the folder nowhere/deeper does not exist: create it first"),
    ],
)  # fmt: skip
def test_an_output_that_names_an_input_or_output_is_refused_before_any_write(
    typed_in, tmp_path, args, said
):
    before = {p: p.read_bytes() for p in [tmp_path / "ec.tsv", tmp_path / "ref/embeddings.h5"]}
    status, lines = typed_in("queries", "--reference", "ref", "-k", 3, *args)
    assert (status, lines) == (2, [f"esmshard neighbours: {said}"])
    assert {p: p.read_bytes() for p in before} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ec.tsv", "queries", "ref"]


@pytest.mark.parametrize(
    "reference, said",
    [
        ("absent", "--reference absent does not exist: give an esmshard run's outdir or its "
         "embeddings.h5"),
        ("s3://lab/ref", "--reference s3://lab/ref is in object storage: esmshard neighbours "
         "reads files; copy its embeddings.h5 here first"),
        ("proteins.fasta", "proteins.fasta is not a whole embeddings file (not an HDF5 file): "
         "give an esmshard run's outdir or its embeddings.h5"),
        ("cut.h5", "cut.h5 is not a whole embeddings file (cut short): give an esmshard run's "
         "outdir or its embeddings.h5"),
    ],
)  # fmt: skip
def test_a_reference_that_is_not_embeddings_is_said_without_remove_it(
    typed_in, tmp_path, reference, said
):
    (tmp_path / "proteins.fasta").write_text(">P1\nMKTAYIAKQR\n")
    whole = (tmp_path / "ref" / "embeddings.h5").read_bytes()
    (tmp_path / "cut.h5").write_bytes(whole[: len(whole) // 2])
    status, lines = typed_in("queries", "--reference", reference, "-o", "n.tsv")
    assert status in (1, 2) and lines == [f"esmshard neighbours: {said}"]
    assert not (tmp_path / "n.tsv").exists()


def test_a_latin_1_annotations_file_is_named_by_line_and_byte(typed_in, tmp_path):
    (tmp_path / "latin.tsv").write_bytes("id\tname\nP1\tcaf\u00e9\n".encode("latin-1"))
    status, lines = typed_in("queries", "--reference", "ref", "-o", "n.tsv",
                             "--annotations", "latin.tsv")  # fmt: skip
    assert (status, lines) == (1, [
        "esmshard neighbours: latin.tsv:2: byte 14 (0xe9) is not UTF-8: save the file as UTF-8 "
        "(in Excel: CSV UTF-8)"
    ])  # fmt: skip


def test_excels_long_form_annotations_keep_every_row_and_the_tables_columns(typed_in, tmp_path):
    """A UTF-8 file with a byte-order mark, a row per ID and term, and a column named `rank`."""
    with Embeddings(tmp_path / "ref") as r:
        ids = r.ids()
    rows = "".join(
        f"{i}\tGO:{n}\tspecies\n{i}\tGO:{n + 100}\tspecies\n" for n, i in enumerate(ids)
    )
    (tmp_path / "goa.tsv").write_text("\ufeffid\tgo\trank\n" + rows, encoding="utf-8")
    status, lines = typed_in("queries", "--reference", "ref", "-k", 3, "-o", "n.tsv",
                             "--annotations", "goa.tsv")  # fmt: skip
    assert status == 0, lines
    table = read(tmp_path / "n.tsv")
    assert list(table[0]) == ["id", "rank", "neighbour", "distance", "go", "annotation_rank"]
    assert [row["rank"] for row in table[:3]] == ["1", "2", "3"]
    for row in table:
        n = ids.index(row["neighbour"])
        assert (row["go"], row["annotation_rank"]) == (f"GO:{n};GO:{n + 100}", "species")
    transfer = read(tmp_path / "n.annotations.tsv")
    assert list(transfer[0])[:4] == ["id", "neighbour", "distance", "reliability_index"]
    # the same distance, printed alike in both tables
    first = {row["id"]: row["distance"] for row in table if row["rank"] == "1"}
    assert all(row["distance"] == first[row["id"]] for row in transfer)


def test_a_parquet_table_names_what_made_it(typed_in, tmp_path):
    import pyarrow.parquet as pq

    status, lines = typed_in("queries", "--reference", "ref", "-k", 2, "-o", "n.parquet")
    assert (status, lines) == (0, ["esmshard neighbours: wrote n.parquet"])
    table = pq.read_table(tmp_path / "n.parquet")
    assert table.column_names == ["id", "rank", "neighbour", "distance"]
    assert table.num_rows == 2 * 12
    card = {k.decode(): v.decode() for k, v in table.schema.metadata.items()}
    assert (card["metric"], card["reference"], card["k"]) == ("euclidean", "ref", "2")
    assert card["model"] == MODEL and int(card["layer"]) > 0


def test_a_per_protein_reference_from_outside_esmshard_gives_the_same_neighbours(
    typed_in, tmp_path
):
    """UniProt's and EAT's layout (a dataset per accession, nothing said of the model), and
    esmshard export's per-protein-h5 (its record IDs in `original_id`, its model named)."""
    import h5py

    with Embeddings(tmp_path / "ref") as r:
        ids, means = r.ids(), r.array("mean")
    with h5py.File(tmp_path / "uniprot.h5", "w") as h5:
        for id_, values in zip(ids, means):
            h5[id_] = values
    exported = esmshard_command("export", tmp_path / "ref", "--format", "per-protein-h5",
                                "--key", "id", "--out", tmp_path / "export.h5")  # fmt: skip
    assert exported.returncode == 0, exported.stderr
    status, _ = typed_in("queries", "--reference", "ref", "-k", 3, "-o", "own.tsv")
    assert status == 0
    status, lines = typed_in("queries", "--reference", "uniprot.h5", "-k", 3, "-o", "uniprot.tsv")
    assert (status, lines) == (0, [
        f"esmshard neighbours: uniprot.h5 does not say which model or layer made it: only its "
        f"width ({means.shape[1]}) was checked; search it with embeddings of the model that "
        "made it",
        "esmshard neighbours: wrote uniprot.tsv",
    ])  # fmt: skip
    status, lines = typed_in("queries", "--reference", "export.h5", "-k", 3, "-o", "export.tsv")
    assert (status, lines) == (0, ["esmshard neighbours: wrote export.tsv"])
    own = (tmp_path / "own.tsv").read_text()
    assert (tmp_path / "uniprot.tsv").read_text() == own == (tmp_path / "export.tsv").read_text()


def test_a_per_protein_file_of_another_width_is_refused_in_one_line(typed_in, tmp_path):
    import h5py

    with h5py.File(tmp_path / "wide.h5", "w") as h5:
        h5["P1"], h5["P2"] = np.zeros(1024, "f4"), np.ones(1024, "f4")
    status, lines = typed_in("queries", "--reference", "wide.h5", "-o", "n.tsv")
    assert (status, lines) == (1, [
        "esmshard neighbours: queries/embeddings.h5 and wide.h5 hold "
        "embeddings 32 and 1024 wide: embed both with the same model"
    ])  # fmt: skip
    assert not (tmp_path / "n.tsv").exists()


def test_queries_whose_embeddings_are_nan_are_said_not_dropped_silently(typed_in, tmp_path):
    import h5py

    nan = tmp_path / "nan.h5"
    nan.write_bytes((tmp_path / "queries" / "embeddings.h5").read_bytes())
    with h5py.File(nan, "r+") as h5:
        (layer,) = [name for name in h5["mean"] if name.isdigit()]
        h5["mean"][layer][2] = np.nan
        second = h5["ids"][2].decode()
    status, lines = typed_in("nan.h5", "--reference", "ref", "-k", 2, "-o", "n.tsv")
    assert (status, lines) == (0, [
        "esmshard neighbours: 1 of the 12 queries' embeddings in nan.h5 hold NaN or infinite "
        f"values (e.g. {second}): they get no neighbours; embed them again with precision: fp32",
        "esmshard neighbours: wrote n.tsv",
    ])  # fmt: skip
    assert {row["id"] for row in read(tmp_path / "n.tsv")} == set(read_ids(nan)) - {second}


def read_ids(path) -> list[str]:
    with Embeddings(path) as emb:
        return emb.ids()


def test_terms_are_carried_as_gopredsim_does_from_every_counted_hit(typed_in, tmp_path, saved):
    """Each reference protein carries two GO terms of four; per query, each term's index is the
    sum of the reliability indices of the k nearest that carry it, over k, to 0.01."""
    with Embeddings(tmp_path / "ref") as r, Embeddings(tmp_path / "queries") as q:
        ids, query_ids = r.ids(), q.ids()
        distances = exact(q.array("mean"), r.array("mean"))
    carried = {i: [f"GO:{n % 4}", f"GO:{(n + 1) % 4}"] for n, i in enumerate(ids)}
    (tmp_path / "go.tsv").write_text(
        "id\tgo\n" + "".join(f"{i}\t{';'.join(t)}\n" for i, t in carried.items())
    )
    status, lines = typed_in("queries", "--reference", "ref", "-k", 3, "-o", "n.tsv",
                             "--annotations", "go.tsv", "--terms", "go")  # fmt: skip
    assert status == 0, lines
    assert lines[0] == (
        f"esmshard neighbours: carried {len(read(tmp_path / 'n.terms.tsv'))} terms of go to 12 "
        "of 12 queries: n.terms.tsv"
    )
    found = {(r["id"], r["term"]): (float(r["reliability"]), int(r["hits"]))
             for r in read(tmp_path / "n.terms.tsv")}  # fmt: skip
    expected = {}
    for n, query in enumerate(query_ids):
        nearest = np.argsort(distances[n], kind="stable")[:3]
        for term in {t for i in nearest for t in carried[ids[i]]}:
            with_term = [i for i in nearest if term in carried[ids[i]]]
            ri = sum(0.5 / (0.5 + distances[n][i]) for i in with_term) / 3
            if round(ri, 2) > 0:
                expected[(query, term)] = (round(ri, 2), len(with_term))
    assert found == expected
    assert len(read(tmp_path / "n.tsv")) == 3 * 12  # the table keeps its k


def test_terms_of_a_column_that_is_not_there_are_refused_in_one_line(typed_in, tmp_path):
    status, lines = typed_in("queries", "--reference", "ref", "-o", "n.tsv",
                             "--annotations", "ec.tsv", "--terms", "go")  # fmt: skip
    assert (status, lines) == (1, [
        "esmshard neighbours: ec.tsv has no column 'go' (it has go_terms, name): name the "
        "column of the terms"
    ])  # fmt: skip
    status, lines = typed_in("queries", "--reference", "ref", "-o", "n.tsv", "--terms", "go")
    assert (status, lines) == (2, ["esmshard neighbours: --terms and --max-distance need "
                                   "--annotations"])  # fmt: skip


def test_an_index_is_kept_beside_the_reference_and_nearest_takes_the_same_option(
    typed_in, tmp_path, monkeypatch
):
    """`--index hnsw` builds an index in ref/neighbours_index, says its recall, and finds what
    the exact search finds (60 proteins: the graph holds them all); the next command and
    `Embeddings.nearest(index="hnsw")` read it; without faiss, both refuse in one line."""
    pytest.importorskip("faiss")
    assert typed_in("queries", "--reference", "ref", "-k", 3, "-o", "exact.tsv")[0] == 0
    said = []
    for _ in range(2):
        status, lines = typed_in("queries", "--reference", "ref", "-k", 3, "-o", "hnsw.tsv",
                                 "--index", "hnsw")  # fmt: skip
        assert status == 0, lines
        said += [line for line in lines if "searched by" in line]
    index = r"ref/neighbours_index/embeddings\.0-60\.hnsw\.\w{32}\.faiss"
    assert re.fullmatch(rf"esmshard neighbours: searched by the hnsw index {index} \(built in "
                        r"\d+\.\d s\): recall@k 1\.000 on 12 queries, setting 16", said[0])  # fmt: skip
    assert re.fullmatch(rf"esmshard neighbours: searched by the hnsw index {index} \(read\): "
                        r"recall@k 1\.000 on 12 queries, setting 16", said[1])  # fmt: skip
    exact_rows, hnsw_rows = read(tmp_path / "exact.tsv"), read(tmp_path / "hnsw.tsv")
    assert [{**r, "distance": None} for r in hnsw_rows] == [
        {**r, "distance": None} for r in exact_rows]  # fmt: skip
    # faiss' fp32 sums: the same distances to their last digit or so
    np.testing.assert_allclose([float(r["distance"]) for r in hnsw_rows],
                               [float(r["distance"]) for r in exact_rows], rtol=1e-6)  # fmt: skip
    with Embeddings("queries") as queries, Embeddings("ref") as reference:
        table = reference.nearest(queries, k=3, index="hnsw")
    assert [[r["id"], r["neighbour"]] for r in read(tmp_path / "exact.tsv")] == (
        table[["id", "neighbour"]].values.tolist()
    )
    assert len(list((tmp_path / "ref" / "neighbours_index").iterdir())) == 2  # read, not built
    monkeypatch.setitem(sys.modules, "faiss", None)  # as where faiss is not installed
    status, lines = typed_in("queries", "--reference", "ref", "-o", "ivf.tsv", "--index", "ivf")
    assert (status, lines) == (2, [
        "esmshard neighbours: --index ivf is a faiss index, and faiss is not installed: pip "
        "install faiss-cpu (or use --index exact)"])  # fmt: skip
    with (
        Embeddings("ref") as reference,
        pytest.raises(
            ValueError,
            match=r"^the ivf index is a "
            "faiss index, and faiss is not installed",
        ),
    ):
        reference.nearest("queries", index="ivf")  # fmt: skip
