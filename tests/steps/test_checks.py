"""The whole config checked before any job (esmshard.steps.checks), without Snakemake."""

import sys

import pytest
from helpers import CONFIG_SCHEMA, GENE_CALLER

from esmshard.config import fp8_problems
from esmshard.models import T5
from esmshard.steps.checks import check_config, defaults


def checked(tmp_path, **typed):
    base = {
        **defaults(CONFIG_SCHEMA),
        "input": [str(GENE_CALLER)],
        "outdir": str(tmp_path / "out"),
    }
    return check_config({**base, "model": "random:esm2_t6_8M_UR50D", **typed}, CONFIG_SCHEMA)


def test_a_config_as_typed_comes_back_as_the_run_uses_it(tmp_path):
    done = checked(tmp_path, repr_layers=["-1", "6"], gpus=["0", "1"], shards="2")
    assert done.problems == []
    assert (done.config["repr_layers"], done.config["gpus"], done.config["shards"]) == (
        [-1, 6], [0, 1], 2)  # fmt: skip
    assert done.config["truncation_seq_length"] == 1022 and done.model.num_layers == 6


def test_every_problem_is_found_at_once_one_line_each(tmp_path):
    done = checked(
        tmp_path, repr_layers=[7, -8, -7, 0], include=["per_tok", "contacts"],
        long_sequences="chunk", toks_per_batch="lots", input=["missing.faa"], gpu=[0],
    )  # fmt: skip
    assert done.problems == [
        "toks_per_batch: lots is not valid; give a whole number of at least 1 or auto",
        "gpu: not a config key of esmshard; did you mean gpus?",
        "include: contacts cannot be combined with long_sequences: chunk (a contact map spans "
        "the whole sequence, a window sees part of it); use long_sequences: truncate, as "
        "fair-esm's extract does, or skip",
        "repr_layers: layer 7 does not exist in esm2_t6_8M_UR50D, which has 6 layers; give 0 "
        "to 6, or -1 (the last) to -7",
        "repr_layers: layer -8 does not exist in esm2_t6_8M_UR50D, which has 6 layers; give 0 "
        "to 6, or -1 (the last) to -7",
        "input FASTA 'missing.faa' does not exist; set `input` to your protein FASTA files",
    ]
    assert not (tmp_path / "out").exists()


def test_a_model_that_cannot_be_had_leaves_the_other_keys_checked(tmp_path):
    done = checked(tmp_path, model="random:esm3", shards=0)
    assert done.model is None and len(done.problems) == 2
    assert done.problems[0].startswith("shards: 0 is not valid")
    assert done.problems[1].startswith("model 'random:esm3': unknown architecture")


def test_fp8_is_refused_where_its_products_are_not_the_ones_computed(tmp_path):
    """precision: fp8 is ESM-2's, ESM-1b/1v's and ESM C's dense products, in esmshard's own
    forward pass: another family, a map from fair-esm's forward pass or fast_path: false are one
    line each."""
    for model in ("random:esm2_t6_8M_UR50D", "random:esm1b_t33_650M_UR50S", "random:esmc_300m"):
        assert checked(tmp_path, precision="fp8", model=model).problems == []
    # T5 and BERT encoders have no random:<name>: their check alone
    (t5,) = fp8_problems({"model": "hf:Rostlab/prot_t5_xl_uniref50", "include": ["mean"]}, T5)
    assert t5 == (
        "precision: fp8: T5 encoder (hf:Rostlab/prot_t5_xl_uniref50) runs in fp32, bf16 or fp16 "
        "only (FP8 products are ESM-2's, ESM-1b/1v's and ESM C's so far); use bf16"
    )
    (maps,) = checked(tmp_path, precision="fp8", include=["mean", "contacts"]).problems
    assert maps.startswith("precision: fp8 cannot compute include: contacts (those maps come")
    (fair_esm,) = checked(tmp_path, precision="fp8", fast_path=False).problems
    assert "fast_path: false asks for fair-esm's" in fair_esm


def test_the_terms_to_carry_are_checked_with_the_config(tmp_path):
    (tmp_path / "go.tsv").write_text("id\tgo\nP1\tGO:1;GO:2\n")
    annotations = str(tmp_path / "go.tsv")
    typed = {"neighbours": "self", "neighbours_annotations": annotations}
    assert checked(tmp_path, **typed, neighbours_terms="go").problems == []
    done = checked(tmp_path, **typed, neighbours_terms="ec", neighbours_transfer="distance")
    assert done.problems == [
        f"neighbours_terms: ec is not a column of {annotations} (go): name the column of the "
        "terms",
        "neighbours_transfer: distance counts the neighbours within neighbours_max_distance: "
        "set it (greater than 0)",
    ]
    typed = {"neighbours_transfer": "distance", "neighbours_max_distance": "0.5"}
    assert checked(tmp_path, neighbours="self", neighbours_terms="go", **typed).problems == [
        "neighbours_terms: needs neighbours_annotations (the terms' table)"
    ]
    assert checked(tmp_path, neighbours_terms="go").problems == [
        "neighbours_terms: needs neighbours (the reference to search)"
    ]
    typed = {"neighbours": "self", "neighbours_annotations": annotations}
    assert checked(tmp_path, **typed, neighbours_ontology=annotations).problems == [
        "neighbours_ontology: needs neighbours_terms (the column of GO terms)"
    ]
    assert checked(tmp_path, **typed, neighbours_terms="go",
                   neighbours_ontology=annotations).problems == [
        f"neighbours_ontology: {annotations} is not a Gene Ontology OBO file (it does not start "
        "with format-version:): give a GO release's go-basic.obo"
    ]  # fmt: skip


def test_an_approximate_index_without_faiss_is_refused_with_the_config(tmp_path, monkeypatch):
    pytest.importorskip("faiss")
    assert checked(tmp_path, neighbours="self", neighbours_index="hnsw").problems == []
    assert checked(tmp_path, neighbours="self", neighbours_index="banana").problems != []
    monkeypatch.setitem(sys.modules, "faiss", None)  # as where faiss is not installed
    assert checked(tmp_path, neighbours="self", neighbours_index="hnsw").problems == [
        "neighbours_index: hnsw is a faiss index, and faiss is not installed: pip install "
        "faiss-cpu (or use exact)"
    ]
    assert checked(tmp_path, neighbours="self", neighbours_index="auto").problems == []
