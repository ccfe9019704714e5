"""Contact maps: fair-esm's `model(tokens, return_contacts=True)`, kept as upper triangles,
through the `snakemake` command line, the reader and the `pt` export."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import PROTEINS, TINY_MODEL, config_check, read_records, snakemake, the_one_refusal

import esmshard
from esmshard.compute.embedder import Embedder
from esmshard.compute.precision import PRECISIONS
from esmshard.embeddings_h5 import contacts
from esmshard.embeddings_h5.representations import KINDS
from esmshard.models.esm2 import random_model

RECORDS = read_records(PROTEINS)
# A protein longer than 1022 residues (its map truncated; each long one costs fair-esm's
# attention maps of every layer and head at 1,024 tokens) and five of 300 residues or fewer:
# a padded batch's contact head works on every layer's and head's map at its longest length.
LONG = [r for r in RECORDS if len(r[1]) > 1022][:1]
CHOSEN = LONG + [r for r in RECORDS if len(r[1]) <= 300][:5]
IDS = [h[1:].split()[0] for h, _ in CHOSEN]


def fair_esm_contacts(sequences, truncation=1022):
    """fair-esm's contact maps, one sequence at a time, truncated as its extract script does."""
    model = random_model(TINY_MODEL).eval()
    convert = model.alphabet.get_batch_converter(truncation)
    maps = []
    for sequence in sequences:
        _, _, tokens = convert([("x", sequence)])
        with torch.inference_mode():
            out = model(tokens, repr_layers=[6], return_contacts=True)
        n = min(len(sequence), truncation)
        maps.append(out["contacts"][0, :n, :n].numpy())
    return maps


@pytest.fixture(scope="module")
def reference():
    return fair_esm_contacts([s for _, s in CHOSEN])


def test_a_triangle_holds_the_whole_symmetric_map():
    matrix = np.arange(16, dtype=np.float32).reshape(4, 4)
    matrix = matrix + matrix.T
    triangle = contacts.upper_triangle(matrix)
    assert triangle.size == contacts.triangle_size(4) == 10
    np.testing.assert_array_equal(contacts.full_matrix(triangle, 4), matrix)
    assert KINDS[contacts.NAME].starts(np.array([1, 3, 0])).tolist() == [0, 1, 7, 7]


def test_batched_triangles_equal_fair_esm_one_sequence_at_a_time(reference):
    model = random_model(TINY_MODEL)
    embedder = Embedder(model, model.alphabet, [6], torch.device("cpu"), PRECISIONS["fp32"],
                        fast_path=True, contacts=True)  # fmt: skip
    short = [s for _, s in CHOSEN[1:]]  # padded in one batch
    for rep, want in zip(embedder.forward(short), reference[1:]):
        got = contacts.full_matrix(rep[6].contacts, len(want))
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)


def test_contacts_through_the_workflow_equal_fair_esm(tmp_path, reference):
    fasta = tmp_path / "proteins.fasta"
    fasta.write_text("".join(f"{h}\n{s}\n" for h, s in CHOSEN))
    # The long protein in a batch of its own, the short ones padded together (the contact head
    # works on every layer's and head's map of every row at the batch's longest length).
    typed = ["--config", f"input={fasta}", f"model=random:{TINY_MODEL}",
             "include=[mean,contacts]", "precision=fp32", "toks_per_batch=1100"]  # fmt: skip
    snakemake(tmp_path, {}, *typed, "contacts_dtype=float32")
    with esmshard.open_embeddings(tmp_path / "results") as emb:
        assert emb.ids() == IDS
        for id_, want in zip(IDS, reference):
            np.testing.assert_allclose(emb.contact_map(id_), want, atol=1e-4, rtol=0)
            assert emb[id_].contacts.shape == want.shape  # long ones truncated to 1022

    exported = subprocess.run([str(Path(sys.executable).parent / "esmshard"), "export", "results",
                               "--format", "pt", "--out", "pt"], cwd=tmp_path)  # fmt: skip
    assert exported.returncode == 0
    index = dict(
        line.split("\t") for line in (tmp_path / "pt" / "index.tsv").read_text().split("\n")[1:-1]
    )
    for id_, want in zip(IDS, reference):
        result = torch.load(tmp_path / "pt" / index[id_], weights_only=True)
        assert result["contacts"].dtype == torch.float32
        np.testing.assert_allclose(result["contacts"].numpy(), want, atol=1e-4, rtol=0)

    # float16 (the default) from the same store: nothing computed again, values within 1e-4
    # plus float16's rounding of a probability (at most 2^-12).
    half = snakemake(tmp_path / "half", {}, *typed, f"store={tmp_path / 'results' / 'store'}")
    assert json.loads((tmp_path / "half" / "results" / "run.json").read_text())["computed"] == 0
    with esmshard.open_embeddings(tmp_path / "half" / "results") as emb:
        assert emb.h5["contacts/values"].dtype == np.float16 and half.returncode == 0
        for id_, want in zip(IDS, reference):
            np.testing.assert_allclose(emb.contact_map(id_), want, atol=1e-4 + 2**-12, rtol=0)


def test_contacts_with_chunked_long_sequences_are_refused_before_any_work(tmp_path):
    refused = config_check(tmp_path, {}, "--config", f"input={PROTEINS}", "long_sequences=chunk",
                           "include=[contacts]", f"model=random:{TINY_MODEL}")  # fmt: skip
    assert "include: contacts cannot be combined with long_sequences: chunk" in the_one_refusal(
        refused
    )
    assert not (tmp_path / "results").exists()


def test_contacts_alone_are_kept_and_read(tmp_path, reference):
    fasta = tmp_path / "proteins.fasta"
    fasta.write_text("".join(f"{h}\n{s}\n" for h, s in CHOSEN[1:]))
    snakemake(tmp_path, {}, "--config", f"input={fasta}", f"model=random:{TINY_MODEL}",
              "include=contacts", "precision=fp32", "contacts_dtype=float32")  # fmt: skip
    with esmshard.open_embeddings(tmp_path / "results") as emb:
        assert emb.layers == {} and emb.ids() == IDS[1:]
        for id_, want in zip(IDS[1:], reference[1:]):
            np.testing.assert_allclose(emb[id_].contacts, want, atol=1e-4, rtol=0)
    esmshard_cli = str(Path(sys.executable).parent / "esmshard")
    refused = subprocess.run([esmshard_cli, "export", "results", "--format", "per-protein-h5",
                              "--out", "x.h5"], cwd=tmp_path, capture_output=True, text=True)  # fmt: skip
    assert refused.returncode == 1 and "holds no representations" in refused.stderr
    exported = subprocess.run([esmshard_cli, "export", "results", "--format", "npy", "--out", "npy"],
                              cwd=tmp_path, capture_output=True, text=True)  # fmt: skip
    assert exported.returncode == 0, exported.stderr
    values = np.load(tmp_path / "npy" / "contacts.npy", mmap_mode="r")
    offsets = np.load(tmp_path / "npy" / "contacts_offsets.npy")
    first = contacts.full_matrix(values[offsets[0] : offsets[1]], len(reference[1]))
    np.testing.assert_allclose(first, reference[1], atol=1e-4, rtol=0)
