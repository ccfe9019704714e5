"""ESM-2 saved by HuggingFace transformers, loaded without it: the same numbers as transformers'
own forward pass, and through `model:` as the same weights in fair-esm's format."""

import json

import numpy as np
import pytest
import torch
from helpers import (
    PROTEINS,
    TINY_MODEL,
    config_check,
    fasta,
    hub_cache,
    read_records,
    snakemake,
    the_one_refusal,
)

import esmshard
from esmshard.compute.embedder import Embedder
from esmshard.compute.precision import PRECISIONS
from esmshard.models import ModelError, parse_spec
from esmshard.models.esm2 import random_model, write_checkpoint
from esmshard.models.esm2_hf import esm2_from_transformers, fair_esm_name

transformers = pytest.importorskip("transformers")  # a test extra: `pip install -e .[test]`

SEQUENCES = [s[:150] for _, s in read_records(PROTEINS)[:4]]


def esm2_config(**changes):
    """An ESM-2 t6 config as the hub's facebook/esm2_t6_8M_UR50D has it."""
    return transformers.EsmConfig(**{
        "vocab_size": 33, "hidden_size": 320, "num_hidden_layers": 6, "num_attention_heads": 20,
        "intermediate_size": 1280, "position_embedding_type": "rotary", "token_dropout": True,
        "pad_token_id": 1, "mask_token_id": 32, "layer_norm_eps": 1e-5,
        "emb_layer_norm_before": False, "max_position_embeddings": 1026, **changes})  # fmt: skip


def saved_from_fair_esm(model, folder, masked_lm=False):
    """fair-esm `model`'s weights in a transformers model, saved as save_pretrained saves it."""
    kind = transformers.EsmForMaskedLM if masked_lm else transformers.EsmModel
    hf = kind(esm2_config())
    fair = model.state_dict()
    state = {}
    for name in hf.state_dict():
        target = fair_esm_name(name)
        if target is not None:
            state[name] = fair[target]
    missing, _ = hf.load_state_dict(state, strict=False)
    assert all("pooler" in k or "inv_freq" in k or "decoder" in k for k in missing), missing
    hf.save_pretrained(folder)
    return folder


def test_converted_weights_give_transformers_own_numbers(tmp_path):
    hf = transformers.EsmModel(esm2_config(attn_implementation="eager")).eval()
    hf.save_pretrained(tmp_path)
    model = esm2_from_transformers(tmp_path)
    tokens = Embedder(model, model.alphabet, [6], torch.device("cpu"), PRECISIONS["fp32"]).tokens(
        SEQUENCES
    )
    with torch.inference_mode():
        ours = model(tokens, repr_layers=[0, 3, 6], return_contacts=True)
        theirs = hf(tokens, attention_mask=tokens.ne(1), output_hidden_states=True)
        their_contacts = hf.predict_contacts(tokens, attention_mask=tokens.ne(1))
    for layer in (0, 3, 6):  # transformers' last hidden state has the final layer norm too
        mask = tokens.ne(1)
        torch.testing.assert_close(ours["representations"][layer][mask],
                                   theirs.hidden_states[layer][mask], atol=1e-5, rtol=0)  # fmt: skip
    for row, sequence in enumerate(SEQUENCES):
        n = len(sequence)
        torch.testing.assert_close(ours["contacts"][row, :n, :n], their_contacts[row, :n, :n],
                                   atol=1e-5, rtol=0)  # fmt: skip


def test_a_masked_lm_folder_and_a_fair_esm_checkpoint_are_the_same_model(tmp_path):
    fair = random_model(TINY_MODEL)
    folder = saved_from_fair_esm(fair, tmp_path / "hf", masked_lm=True)
    converted = esm2_from_transformers(folder)
    for name, tensor in fair.state_dict().items():
        if not name.startswith("lm_head"):
            assert torch.equal(converted.state_dict()[name], tensor), name


@pytest.mark.parametrize(
    "change, message",
    [
        ({"position_embedding_type": "absolute"}, 'position_embedding_type is "absolute"'),
        ({"vocab_size": 40}, "vocab_size is 40"),
    ],
)
def test_a_config_that_is_no_esm2_is_refused_by_name(tmp_path, change, message):
    transformers.EsmModel(esm2_config(**change)).save_pretrained(tmp_path)
    with pytest.raises(ModelError, match=message):
        parse_spec(str(tmp_path))


def means(emb):
    return emb.h5["mean/6"][:], emb.h5["mean/2"][:], json.loads(emb.h5.attrs["settings"])


def test_folder_and_hub_id_give_the_fair_esm_checkpoints_embeddings(tmp_path):
    fair = random_model(TINY_MODEL)
    checkpoint = write_checkpoint(fair, tmp_path / "fair", TINY_MODEL)
    folder = saved_from_fair_esm(fair, tmp_path / "esm2_t6_saved")
    cache = hub_cache(tmp_path / "hub", "facebook/esm2_t6_8M_UR50D", folder)
    offline = {"HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}
    # five records and one past 1,022 residues: the three ways in are the test
    records = read_records(PROTEINS)
    short = [r for r in records if len(r[1]) <= 1022][:5]
    long = [r for r in records if len(r[1]) > 1022][:1]
    proteins = fasta(tmp_path / "proteins.fasta", short + long)
    # the hub's name through the command line (the hub's cache is the environment's); the files
    # in this process
    typed = ["--config", f"input={proteins}", "repr_layers=[-1,2]"]
    snakemake(tmp_path / "c", {}, *typed, "model=hf:facebook/esm2_t6_8M_UR50D", env=offline)
    with esmshard.embed(proteins, str(checkpoint), repr_layers=[-1, 2]) as a, \
            esmshard.embed(proteins, str(folder), repr_layers=[-1, 2]) as b, \
            esmshard.open_embeddings(tmp_path / "c" / "results") as c:  # fmt: skip
        want = means(a)
        for run in (b, c):
            got = means(run)
            np.testing.assert_allclose(got[0], want[0], atol=1e-5, rtol=0)
            np.testing.assert_allclose(got[1], want[1], atol=1e-5, rtol=0)
        assert means(b)[2]["checkpoint"].startswith("folder, sha256 config.json=")
        hub = means(c)[2]["checkpoint"]
    # A hub download is the repository at the revision that was loaded.
    assert hub == f"facebook/esm2_t6_8M_UR50D revision {'0' * 40} from the HuggingFace hub"


def test_a_hub_id_missing_offline_says_how_to_get_it(tmp_path):
    offline = {"HF_HUB_CACHE": str(tmp_path / "empty"), "HF_HUB_OFFLINE": "1"}
    result = snakemake(tmp_path, {}, "--config", f"input={PROTEINS}",
                       "model=hf:facebook/esm2_t6_8M_UR50D", env=offline, check=False)  # fmt: skip
    assert result.returncode != 0
    assert "cannot download hf:facebook/esm2_t6_8M_UR50D" in result.stderr
    assert "hf download facebook/esm2_t6_8M_UR50D" in result.stderr


def test_scores_of_a_masked_lm_folder_are_transformers_own_and_a_headless_one_is_refused(tmp_path):
    """EsmForMaskedLM's files hold the head: its logits, through esmshard's fast path, are
    transformers' own; EsmModel's lack it, and scores from them are refused before any job."""
    from esmshard.embeddings_h5.scores import AMINO_ACIDS
    from esmshard.models import score_problems

    hf = transformers.EsmForMaskedLM(esm2_config(attn_implementation="eager")).eval()
    hf.save_pretrained(tmp_path / "masked")
    model = esm2_from_transformers(tmp_path / "masked")
    embedder = Embedder(model, model.alphabet, [6], torch.device("cpu"), PRECISIONS["fp32"],
                        kinds=["logits"], packed=True)  # fmt: skip
    tokens = embedder.tokens(SEQUENCES)
    with torch.inference_mode():
        want = torch.log_softmax(hf(tokens, attention_mask=tokens.ne(1)).logits, -1)
    columns = [model.alphabet.get_idx(a) for a in AMINO_ACIDS]
    for row, rep in enumerate(embedder.forward(SEQUENCES)):
        n = len(SEQUENCES[row])
        np.testing.assert_allclose(rep[6].logits, want[row, 1 : n + 1, columns], atol=1e-4)
    assert score_problems(parse_spec(str(tmp_path / "masked")), ["logits"]) == []

    transformers.EsmModel(esm2_config()).save_pretrained(tmp_path / "headless")
    (refused,) = score_problems(parse_spec(str(tmp_path / "headless")), ["logits"])
    assert "holds no language-model head" in refused and "EsmForMaskedLM" in refused
    with pytest.raises(ValueError, match="language-model head"):
        headless = esm2_from_transformers(tmp_path / "headless")
        Embedder(headless, headless.alphabet, [6], torch.device("cpu"), PRECISIONS["fp32"],
                 kinds=["logits"])  # fmt: skip


def test_a_folder_whose_config_says_more_layers_than_its_weights_is_one_line_before_any_job(
    tmp_path,
):
    folder = saved_from_fair_esm(random_model(TINY_MODEL), tmp_path / "model")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 7}))
    refused = config_check(tmp_path, {"input": str(PROTEINS), "model": str(folder)})
    assert the_one_refusal(refused).startswith(
        f"esmshard: {folder}: tensor contact_head.regression.weight is [1, 120] in the weights, "
        "where the ESM-2 of 7 layers and dimension 320 that its config says has [1, 140]"
    )
