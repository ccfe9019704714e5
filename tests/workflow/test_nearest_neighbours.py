"""The neighbours steps through `snakemake` as users type them: every protein's k neighbours equal
numpy's exact search of embeddings.h5, annotations carried; 1 and 3 search jobs give the same
table; a kill during the search loses only the unfinished jobs."""

import csv
import hashlib
import html
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import pyarrow.parquet as pq
import pytest
from helpers import (
    MODEL,
    REPO,
    SLICE,
    TINY_MODEL,
    config_check,
    fasta,
    jobs_run,
    kill_9_when,
    snakemake,
    snakemake_command,
    the_one_refusal,
)

import esmshard
from esmshard.outputs.reader import Embeddings

RECORDS = SLICE[:40]


def sha256_of(path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def read(path) -> list[dict]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh, delimiter="\t"))


def settings(tmp_path, *more) -> dict:
    return {"input": [str(fasta(tmp_path / "proteins.fasta", RECORDS))], "model": MODEL,
            "neighbours": "self", "neighbours_k": 4, **dict(more)}  # fmt: skip


@pytest.fixture(scope="module")
def annotations(tmp_path_factory):
    path = tmp_path_factory.mktemp("annotations") / "ec.tsv"
    ids = [h[1:].split()[0] for h, _ in RECORDS]
    path.write_text("id\tec\n" + "".join(
        f"{i}\t3.1.{n % 3}.1;3.2.{n % 2}.1\n" for n, i in enumerate(ids[::2])))  # fmt: skip
    return path


def test_every_proteins_neighbours_equal_numpys_exact_search(tmp_path, annotations):
    config = settings(tmp_path, ("neighbours_annotations", str(annotations)),
                      ("neighbours_shards", 3), ("neighbours_terms", "ec"))  # fmt: skip
    done = snakemake(tmp_path / "run", config)
    assert jobs_run(done)["neighbour_part"] == 3
    out = tmp_path / "run" / "results"
    (outputs,) = [ln for ln in done.stderr.splitlines() if ln.startswith("esmshard: outputs: ")]
    relative = out.relative_to(tmp_path / "run")
    assert outputs.endswith(
        f", {relative}/neighbours.tsv, {relative}/neighbours.parquet, {relative}/annotations.tsv"
        f", {relative}/transfer.tsv, {relative}/transfer.parquet"
    )
    with Embeddings(out) as emb:
        values, ids = emb.array("mean").astype(np.float64), emb.ids()
    distances = np.sqrt(((values[:, None] - values[None]) ** 2).sum(-1))
    np.fill_diagonal(distances, np.inf)  # each protein's own row left out
    rows = read(out / "neighbours.tsv")
    with open(annotations, newline="") as fh:
        ec = {row["id"]: row["ec"] for row in csv.DictReader(fh, delimiter="\t")}
    for n, protein in enumerate(ids):
        order = np.argsort(distances[n], kind="stable")[:4]
        mine = [row for row in rows if row["id"] == protein]
        assert [row["neighbour"] for row in mine] == [ids[i] for i in order]
        np.testing.assert_allclose([float(r["distance"]) for r in mine], distances[n][order],
                                   rtol=1e-5)  # fmt: skip
        assert [row["ec"] for row in mine] == [ec.get(ids[i], "") for i in order]
    # each protein's nearest annotated neighbour among its k, and that distance's RI
    transfer = {row["id"]: row for row in read(out / "annotations.tsv")}
    for n, protein in enumerate(ids):
        order = np.argsort(distances[n], kind="stable")[:4]
        nearest = next((i for i in order if ids[i] in ec), None)
        row = transfer[protein]
        if nearest is None:
            assert (row["neighbour"], row["ec"], row["reliability_index"]) == ("", "", "")
            continue
        assert (row["neighbour"], row["ec"]) == (ids[nearest], ec[ids[nearest]])
        expected = 0.5 / (0.5 + distances[n][nearest])
        assert float(row["reliability_index"]) == pytest.approx(expected, abs=1e-6)
    # every term of the 4 nearest (and those tied with the 4th), goPredSim's way
    expected = {}
    for n, protein in enumerate(ids):
        order = np.argsort(distances[n], kind="stable")
        counted = order[distances[n][order] <= distances[n][order[3]]]
        terms = {i: ec.get(ids[i], "").split(";") if ids[i] in ec else [] for i in counted}
        for term in {t for found in terms.values() for t in found}:
            ri = sum(0.5 / (0.5 + distances[n][i]) for i in counted if term in terms[i])
            if round(ri / len(counted), 2) > 0:
                expected[(protein, term)] = (round(ri / len(counted), 2),
                                             sum(term in terms[i] for i in counted))  # fmt: skip
    carried = {(r["id"], r["term"]): (float(r["reliability"]), int(r["hits"]))
               for r in read(out / "transfer.tsv")}  # fmt: skip
    assert carried == expected
    card = pq.read_table(out / "transfer.parquet").schema.metadata
    assert (card[b"terms"], card[b"k"], card[b"reference"]) == (b"ec", b"4", b"self")
    # the search jobs in the scaling report and in `esmshard status`
    report = json.loads((out / "report" / "scaling.json").read_text())["neighbours"]
    assert (report["jobs"], report["reference_rows"], report["queries"]) == (3, 40, 40)
    assert (
        "<h2>Nearest neighbours</h2><p>3 search jobs: 40 reference rows against 40 "
        in (out / "report" / "scaling_report.html").read_text()
    )
    status = subprocess.run([str(Path(sys.executable).parent / "esmshard"), "status", str(out)],
                            capture_output=True, text=True)  # fmt: skip
    assert "neighbours: 3 of 3 search jobs done; neighbours.tsv written" in status.stdout
    table = pq.read_table(out / "neighbours.parquet")
    assert table.num_rows == len(rows)
    assert table.schema.metadata[b"metric"] == b"euclidean"
    assert table.schema.metadata[b"reference"] == b"self"


def test_one_and_three_search_jobs_give_the_same_table(tmp_path):
    tables = []
    for shards in (1, 3):
        done = snakemake(tmp_path / str(shards), settings(tmp_path, ("neighbours_shards", shards)))
        assert jobs_run(done)["neighbour_part"] == shards
        tables.append((tmp_path / str(shards) / "results" / "neighbours.tsv").read_text())
    assert tables[0] == tables[1]


def test_a_reference_embedded_earlier_is_searched(tmp_path):
    """By the layer's number where the run keeps it as -1, k past the reference clamped to it,
    and Excel's long-form annotations with a column named as the table's own."""
    reference = tmp_path / "reference"
    snakemake(reference, {"input": [str(fasta(tmp_path / "ref.fasta", SLICE[40:100]))],
                          "model": MODEL})  # fmt: skip
    reference_ids = [h[1:].split()[0] for h, _ in SLICE[40:100]]
    annotations = tmp_path / "excel.csv"
    annotations.write_text("\ufeffid,ec,distance\n" + "".join(
        f"{i},3.1.{n}.1,far\n{i},3.2.{n}.1,far\n" for n, i in enumerate(reference_ids)
    ), encoding="utf-8")  # fmt: skip
    config = settings(tmp_path, ("neighbours", str(reference / "results")),
                      ("neighbours_layer", 6), ("neighbours_k", 2_000_000_000),
                      ("neighbours_annotations", str(annotations)))  # fmt: skip
    done = snakemake(tmp_path / "run", config)
    out = tmp_path / "run" / "results"
    rows = read(out / "neighbours.tsv")
    assert len(rows) == 60 * len(RECORDS) and {r["neighbour"] for r in rows} == set(reference_ids)
    assert list(rows[0]) == ["id", "rank", "neighbour", "distance", "ec", "annotation_distance"]
    for row in rows:
        n = reference_ids.index(row["neighbour"])
        assert (row["ec"], row["annotation_distance"]) == (f"3.1.{n}.1;3.2.{n}.1", "far")
        float(row["distance"])
    (log,) = (out / "logs" / "neighbours").glob("*.log")
    assert "neighbours_k = 2000000000, but the reference holds 60 proteins" in log.read_text()
    assert "annotations.tsv" in done.stderr
    # a later command searches the same reference as UniProt lays it out (a dataset per
    # accession), in two parts, with no annotations: the same nearest 4, every output its own
    first = {(r["id"], r["rank"]): r["neighbour"] for r in rows if int(r["rank"]) <= 4}
    uniprot = tmp_path / "per-protein.h5"
    with Embeddings(reference / "results") as r, h5py.File(uniprot, "w") as h5:
        for id_, values in zip(r.ids(), r.array("mean", 6)):
            h5[id_] = values
    later = snakemake(tmp_path / "run", settings(tmp_path, ("neighbours", str(uniprot)),
                                                 ("neighbours_shards", 2)))  # fmt: skip
    assert jobs_run(later) == {"neighbour_part": 2, "neighbours": 1, "report": 1}
    assert not (out / "annotations.tsv").exists()
    assert sorted(p.name for p in (out / "neighbours").iterdir()) == [
        "0-of-2.json", "0-of-2.npz", "1-of-2.json", "1-of-2.npz"]  # fmt: skip
    assert {(r["id"], r["rank"]): r["neighbour"] for r in read(out / "neighbours.tsv")} == first
    log = out / "logs" / "neighbours.log"
    assert f"{uniprot} does not say which model or layer made it: only its width" in (
        log.read_text()
    )
    report = (out / "report" / "scaling_report.html").read_text()
    section = report.split("<h2>Nearest neighbours</h2>")[1].split("<h2>")[0]
    asked = dict(re.findall(r"<td class=label>([^<]*)</td><td class=text>([^<]*)</td>", section))
    assert {k: asked[k] for k in ("reference", "neighbours per protein (k)", "distance",
                                  "layer of the mean embeddings")} == {
        "reference": str(uniprot), "neighbours per protein (k)": "4", "distance": "euclidean",
        "layer of the mean embeddings": "6"}  # fmt: skip
    assert f"-d {tmp_path / 'run'} " in html.unescape(asked["command"])
    searched = time.mktime(time.strptime(asked["finished"][:19], "%Y-%m-%d %H:%M:%S"))
    embedded = json.loads((out / "run.json").read_text())["finished_at"]
    assert searched > embedded  # the later command's search, not the embedding's
    # an IVF index of each part, kept beside the reference, read by the next search of it
    config = settings(tmp_path, ("neighbours", str(reference / "results")),
                      ("neighbours_shards", 2), ("neighbours_index", "ivf"))  # fmt: skip
    snakemake(tmp_path / "run", config)
    kept = reference / "results" / "neighbours_index"
    assert sorted(p.name.split(".", 3)[:2] + [p.suffix] for p in kept.iterdir()) == [
        ["embeddings", "0-30", ".faiss"], ["embeddings", "0-30", ".json"],
        ["embeddings", "30-60", ".faiss"], ["embeddings", "30-60", ".json"]]  # fmt: skip
    assert {(r["id"], r["rank"]): r["neighbour"] for r in read(out / "neighbours.tsv")} == first
    card = pq.read_schema(out / "neighbours.parquet").metadata
    assert (card[b"index"], card[b"recall_at_k"]) == (b"ivf", b"1.0")  # one list: it is exact
    report = (out / "report" / "scaling_report.html").read_text()
    section = report.split("<h2>Nearest neighbours</h2>")[1].split("<h2>")[0]
    assert section.count("<td>ivf</td><td>1.00</td><td>True</td>") == 2
    snakemake(tmp_path / "run", config, "--forcerun", "neighbour_part")
    for part in ("0-of-2", "1-of-2"):
        log = (out / "logs" / "neighbours" / f"{part}.log").read_text()
        assert re.search(rf"by the ivf index {kept}/embeddings\.\d+-\d+\.ivf\.\w+\.faiss \(read\)"
                         r": recall@k 1\.000 on 40 queries, setting 1", log), log  # fmt: skip


def test_mistakes_in_the_reference_and_annotations_are_refused_before_any_job(tmp_path):
    other = tmp_path / "other"
    esmshard.embed({"a": "MKTAYIAKQR"}, f"random:{TINY_MODEL}", store=tmp_path / "s").save(other)
    (tmp_path / "accession.tsv").write_text("accession\tec\nP1\t1.1.1.1\n")
    config = settings(tmp_path, ("neighbours", str(other)),
                      ("neighbours_annotations", str(tmp_path / "accession.tsv")))  # fmt: skip
    done = snakemake(tmp_path / "run", config, check=False)
    assert done.returncode != 0 and not jobs_run(done) and "Traceback" not in done.stderr
    lines = [ln for ln in done.stderr.splitlines() if ln.startswith("esmshard:")]
    assert lines == [
        f"esmshard: neighbours: {other / 'embeddings.h5'} was embedded with random:{TINY_MODEL}, "
        f"this run with weights {sha256_of(MODEL)}: give the reference's esmshard outdir or "
        "embeddings.h5 (embedded with the same model)",
        f"esmshard: neighbours_annotations: {tmp_path / 'accession.tsv'}: no `id` column in its "
        "header (accession, ec): name the column of the reference's IDs `id`",
    ]


@pytest.mark.parametrize("reference", ["proteins.fasta", "cut.h5"])
def test_a_reference_that_is_not_embeddings_is_refused_in_one_line(tmp_path, reference):
    whole = tmp_path / "whole"
    esmshard.embed({"a": "MKTAYIAKQR"}, MODEL, store=tmp_path / "s").save(whole)
    data = (whole / "embeddings.h5").read_bytes()
    (tmp_path / "cut.h5").write_bytes(data[: len(data) // 2])
    (tmp_path / "header.tsv").write_text("\ufeffid\tec\n")
    config = settings(tmp_path, ("neighbours", str(tmp_path / reference)),
                      ("neighbours_annotations", str(tmp_path / "header.tsv")))  # fmt: skip
    lines = config_check(tmp_path / "run", config)
    said = {"proteins.fasta": "not an HDF5 file", "cut.h5": "cut short"}[reference]
    assert lines == [
        f"esmshard: neighbours: {tmp_path / reference} is not a whole embeddings file ({said}): "
        "give the reference's esmshard outdir or embeddings.h5 (embedded with the same model), "
        "or self",
        f"esmshard: neighbours_annotations: {tmp_path / 'header.tsv'} holds a header but no "
        "rows: give the reference proteins' annotations",
    ]


def test_a_killed_search_reruns_only_its_unfinished_jobs(tmp_path):
    config = settings(tmp_path, ("neighbours_shards", 3))
    snakemake(tmp_path / "run", config, "--until", "merge")
    cmd, env = snakemake_command(tmp_path / "run", config)
    parts = tmp_path / "run" / "results" / "neighbours"
    kill_9_when(cmd, env, lambda: parts.is_dir() and any(parts.glob("*.npz")))
    finished = len(list(parts.glob("*.npz")))
    again = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    assert again.returncode == 0, again.stderr[-3000:]
    assert jobs_run(again).get("neighbour_part", 0) == 3 - finished
    assert len(read(tmp_path / "run" / "results" / "neighbours.tsv")) == 4 * len(RECORDS)


def test_k_past_the_reference_is_said_in_the_search_log(tmp_path):
    config = settings(tmp_path, ("neighbours_k", 50))
    snakemake(tmp_path / "run", config)
    (log,) = (tmp_path / "run" / "results" / "logs" / "neighbours").glob("*.log")
    assert (
        "neighbours_k = 50, but the reference holds 40 proteins (its own left out): each "
        "protein gets 39"
    ) in log.read_text()
    rows = read(tmp_path / "run" / "results" / "neighbours.tsv")
    assert len(rows) == 40 * 39


def test_a_reference_that_is_not_there_is_refused_before_any_job(tmp_path):
    config = settings(tmp_path, ("neighbours", str(tmp_path / "nowhere")))
    assert the_one_refusal(config_check(tmp_path / "run", config)) == (
        f"esmshard: neighbours: {tmp_path / 'nowhere'} is neither an embeddings.h5 nor an outdir "
        "that holds one: give the reference's (embedded with the same model), or self"
    )
    assert os.path.exists(tmp_path / "proteins.fasta")
