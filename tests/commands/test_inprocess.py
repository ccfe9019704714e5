"""`esmshard.embed`: the workflow's numbers in the calling process, its errors in one line."""

import h5py
import numpy as np
import pytest
from conftest import MODEL, PROTEINS, config, read_records, snakemake

import esmshard
from esmshard.config import ConfigError
from esmshard.input.fasta import FastaError
from esmshard.models import ModelError

RECORDS = {header[1:].split()[0]: sequence for header, sequence in read_records(PROTEINS)}


@pytest.fixture(scope="module")
def workflow_run(tmp_path_factory):
    """The same proteins through the `snakemake` command line, as users run them."""
    workdir = tmp_path_factory.mktemp("workflow")
    outdir = workdir / "results"
    snakemake(workdir, {}, *config(PROTEINS, outdir, "repr_layers=[-1,3]", "include=[mean,bos]"))
    with h5py.File(outdir / "embeddings.h5") as h5:
        ids = h5["ids"].asstr()[:].tolist()
        return ids, {name: h5[name][:] for name in ("mean/6", "mean/3", "bos/6")}


def test_a_mapping_gives_a_snakemake_runs_numbers(workflow_run, tmp_path):
    ids, want = workflow_run
    store = tmp_path / "store"
    got = esmshard.embed(RECORDS, MODEL, repr_layers=(-1, 3), include=("mean", "bos"), store=store)
    assert got.ids() == ids and got.failed == {}
    for name, values in want.items():
        kind, layer = name.split("/")
        assert np.abs(got.array(kind, int(layer)) - values).max() <= 1e-5
    assert np.array_equal(got[ids[0]].mean[6], got.array("mean")[0])
    # Pairs, or the FASTA file itself, with the same store: nothing is computed again.
    parts = sorted(store.rglob("*.h5"))
    same = {"repr_layers": [-1, 3], "include": ["mean", "bos"], "store": store}
    again = esmshard.embed(list(RECORDS.items())[:5], MODEL, **same)
    assert again.ids() == ids[:5] and np.array_equal(again.array("mean"), got.array("mean")[:5])
    from_file = esmshard.embed(str(PROTEINS), MODEL, **same)
    assert np.array_equal(from_file.array("bos"), got.array("bos"))
    assert sorted(store.rglob("*.h5")) == parts


def test_long_sequences_and_failures_follow_the_workflows_settings():
    long_id = max(RECORDS, key=lambda i: len(RECORDS[i]))
    assert len(RECORDS[long_id]) > 1022
    got = esmshard.embed({long_id: RECORDS[long_id]}, MODEL, long_sequences="skip")
    assert len(got) == 0 and "1022" in got.failed[long_id]
    truncated = esmshard.embed({long_id: RECORDS[long_id]}, MODEL, truncation_seq_length=100)
    assert truncated[long_id].length == 100


@pytest.mark.parametrize(
    "sequences, model, settings, error, words",
    [
        ({"P1": ""}, MODEL, {}, ValueError, "sequence P1 is empty"),
        ({"P1": "ACGTTGCAACGTTGCAACGTAC"}, MODEL, {}, ValueError, "looks like nucleotides"),
        ({"P1": "MKV1"}, MODEL, {}, FastaError, "character '1' is not an amino-acid letter"),
        ([("P1", "MKV"), ("P1", "MKL")], MODEL, {}, ValueError, "the ID P1 is given twice"),
        ({}, MODEL, {}, ValueError, "no sequences were given"),
        ({"P1": "MKV"}, "esm3_huge", {}, ModelError, "not a model name esmshard knows"),
        ({"P1": "MKV"}, MODEL, {"precision": "fp8"}, ConfigError, "precision: 'fp8'"),
        ("no/such.fasta", MODEL, {}, FastaError, "no/such.fasta: does not exist"),
        ({"P1": "MKV"}, "random:esmc_300m", {"include": ["contacts"]}, ConfigError, "contact"),
    ],
    ids=["empty", "dna", "letter", "repeated-id", "none", "model", "setting", "file", "contacts"],
)
def test_bad_input_is_one_line_naming_it(sequences, model, settings, error, words):
    with pytest.raises(error) as raised:
        esmshard.embed(sequences, model, **settings)
    message = str(raised.value)
    assert words in message and "\n" not in message


def test_in_memory_results_say_what_they_cannot_do():
    got = esmshard.embed({"P1": "MKTAYIAKQR"}, MODEL)
    with pytest.raises(KeyError, match="'P2' is not in these embeddings"):
        got["P2"]
    with pytest.raises(ValueError, match="held in memory"):
        got.dataset()
