"""ProtBert (a BERT encoder) in esmshard's own module: transformers' BertModel numbers, the
residues prepared as ProtBert's authors prepare them, through `snakemake` as users type it; its
refusals, by the config check that the Snakefile runs."""

import json
import re

import numpy as np
import pytest
import torch
from helpers import (
    PROTEOME,
    config_check,
    hidden_states_alone,
    hub_cache,
    read_records,
    snakemake,
    the_one_refusal,
    write_subset,
)

import esmshard
from esmshard.compute.embedder import Embedder
from esmshard.compute.precision import PRECISIONS
from esmshard.models import BERT, ModelError, parse_spec
from esmshard.models.bert import ProtBert
from esmshard.models.bert_files import SHAPES, SPECIALS
from esmshard.models.spec import Arch

transformers = pytest.importorskip("transformers")  # a test extra: `pip install -e .[test]`

# Real proteins: every 80th record of the proteome of at most 400 residues, and the records
# with U (selenocysteine), which ProtBert reads as X.
PROTEINS = write_subset(
    "ecoli_bert.fasta", lambda i, h, s: i % 80 == 0 and len(s) <= 400 or "U" in s
)
# A numbering of the test's own: BERT's specials, then the residues in reverse order.
RESIDUES = "ZYXWVUTSRQPONMLKIHGFEDCBA"


def records():
    return [(header[1:].split()[0], sequence) for header, sequence in read_records(PROTEINS)]


def saved_bert(folder, arch: Arch, ffn: int, layers: int, safe=True, vocabulary=None):
    """A random ProtBert-like BertForMaskedLM (its LayerNorms moved away from 1 and 0, so that
    one left out shows) saved by transformers with a vocab.txt; `safe` False: its weights in a
    pytorch_model.bin instead."""
    folder.mkdir(parents=True, exist_ok=True)
    tokens = vocabulary or [*SPECIALS, *RESIDUES]
    (folder / "vocab.txt").write_text("".join(f"{t}\n" for t in tokens))
    config = transformers.BertConfig(
        vocab_size=len(tokens), hidden_size=arch.dim, num_hidden_layers=layers,
        num_attention_heads=arch.heads, intermediate_size=ffn, max_position_embeddings=40000,
        hidden_act="gelu", layer_norm_eps=1e-12, pad_token_id=tokens.index("[PAD]"),
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.BertForMaskedLM(config).eval()
    with torch.no_grad():
        for name, tensor in model.named_parameters():
            if "LayerNorm" in name:
                tensor.add_(torch.randn_like(tensor) * 0.3)
    model.save_pretrained(folder)
    if not safe:  # as Rostlab's repositories hold it
        from safetensors.torch import load_file

        (weights,) = folder.glob("*.safetensors")
        torch.save(load_file(weights), folder / "pytorch_model.bin")
        weights.unlink()
    return folder


def reference(folder, sequences):
    """transformers' hidden states of `sequences`, tokenized as ProtBert's authors do: residues
    space-separated, U, Z, O and B as X, by the folder's own vocabulary; each protein run
    alone, its rows zero past its tokens."""
    tokenizer = transformers.BertTokenizer(str(folder / "vocab.txt"), do_lower_case=False)
    words = [" ".join(re.sub("[UZOB]", "X", s)) for s in sequences]
    tokens = tokenizer(words, padding=True, return_tensors="pt")
    model = transformers.BertModel.from_pretrained(folder, add_pooling_layer=False).eval()
    attended = tokens["attention_mask"].bool()
    return tokens["input_ids"], hidden_states_alone(model, tokens["input_ids"], attended)


def test_every_layer_and_the_tokens_equal_transformers(tmp_path):
    folder = saved_bert(tmp_path / "bert", Arch(3, 64, 4), 128, 3)
    spec = parse_spec(str(folder))
    assert (spec.family, spec.arch) == (BERT, (3, 64, 4))
    net, alphabet = esmshard.models.load(spec)
    assert isinstance(net, ProtBert)
    sequences = [s for _, s in records()][:6] + [s for _, s in records() if "U" in s][:1]
    tokens, hidden = reference(folder, sequences)
    embedder = Embedder(net, alphabet, [0, 1, 3], torch.device("cpu"), PRECISIONS["fp32"],
                        kinds=("mean", "per_tok", "bos"))  # fmt: skip
    assert torch.equal(embedder.tokens(sequences), tokens)  # [CLS], residues, [SEP], [PAD]
    reps = embedder.forward(sequences)
    for row, sequence in enumerate(sequences):
        for layer in (0, 1, 3):
            residues = hidden[layer][row, 1 : len(sequence) + 1].numpy()  # [CLS], [SEP] out
            np.testing.assert_allclose(reps[row][layer].per_tok, residues, atol=1e-5, rtol=0)
            np.testing.assert_allclose(reps[row][layer].mean, residues.mean(0), atol=1e-5, rtol=0)
            np.testing.assert_allclose(reps[row][layer].bos, hidden[layer][row, 0], atol=1e-5)


def test_protberts_width_gives_transformers_numbers_through_snakemake(tmp_path):
    """ProtBert's width (D = 1024, 16 heads, feed-forward 4096), two of its 30 layers, saved as
    Rostlab's repositories hold it (pytorch_model.bin, BertForMaskedLM's names) and reached by
    its hf: name from the cache."""
    shape = SHAPES["prot_bert"]
    folder = saved_bert(tmp_path / "prot_bert", shape.arch, shape.ffn, 2, safe=False)
    assert (folder / "pytorch_model.bin").is_file()
    listed = records()
    assert any("U" in s for _, s in listed)
    _, hidden = reference(folder, [s for _, s in listed])
    cache = hub_cache(tmp_path / "hub", "Rostlab/prot_bert", folder)
    env = {"HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}
    snakemake(tmp_path / "run", {}, "--config", f"input={PROTEINS}", "model=hf:Rostlab/prot_bert",
              "repr_layers=[-1,1]", "include=[mean,per_tok,bos]", "precision=fp32",
              env=env)  # fmt: skip
    with esmshard.open_embeddings(tmp_path / "run" / "results") as emb:
        assert emb.h5.attrs["model_family"] == "bert"
        assert set(emb.ids()) == {id_ for id_, _ in listed}
        for row, (id_, sequence) in enumerate(listed):
            protein = emb[id_]
            for layer in (2, 1):
                want = hidden[layer][row, 1 : len(sequence) + 1].numpy()
                np.testing.assert_allclose(protein.per_tok[layer], want, atol=1e-4, rtol=0)
                np.testing.assert_allclose(protein.mean[layer], want.mean(0), atol=1e-4, rtol=0)
                np.testing.assert_allclose(protein.bos[layer], hidden[layer][row, 0], atol=1e-4)


def test_a_vocabulary_of_another_convention_or_none_is_refused_before_any_job(tmp_path):
    other = [*SPECIALS, *RESIDUES, "##A", "<mask>"]  # word pieces: not one token per residue
    folder = saved_bert(tmp_path / "other", Arch(1, 32, 2), 64, 1, vocabulary=other)
    line = the_one_refusal(
        config_check(tmp_path / "run", {}, "--config", f"input={PROTEOME}", f"model={folder}")
    )
    assert "vocab.txt: the tokenizer has tokens esmshard cannot account for (##A, <mask>)" in line
    assert not (tmp_path / "run" / "results").exists()

    (folder / "vocab.txt").unlink()
    with pytest.raises(ModelError, match=f"model folder '{folder}' holds no vocab.txt"):
        parse_spec(str(folder))


def test_contacts_and_lengths_beyond_its_positions_are_refused_and_bos_is_cls(tmp_path):
    folder = saved_bert(tmp_path / "bert", Arch(1, 32, 2), 64, 1)
    typed = ["--config", f"input={PROTEOME}", f"model={folder}"]
    refused = config_check(tmp_path / "run", {}, *typed, "include=[mean,contacts]")
    assert "include: contacts: BERT encoder" in the_one_refusal(refused)
    assert BERT.bos and not BERT.contacts
    # 40,000 positions: a longer limit than the default 4,096 is the user's, up to where they end
    line = the_one_refusal(
        config_check(tmp_path / "run", {}, *typed, "truncation_seq_length=50000")
    )
    assert "truncation_seq_length 50000 is beyond the 39998 residues that bert's positions" in line
    assert config_check(tmp_path / "run", {}, *typed, "truncation_seq_length=39998") == []
    assert not (tmp_path / "run" / "results").exists()


def test_a_vocabulary_numbering_tokens_past_the_models_is_one_line_before_any_job(tmp_path):
    folder = saved_bert(tmp_path / "bert", Arch(1, 32, 2), 64, 1)
    # another model's vocabulary: one letter more before the residues, so the last is numbered
    # past the 30 embeddings of these weights
    (folder / "vocab.txt").write_text("".join(f"{t}\n" for t in [*SPECIALS, "J", *RESIDUES]))
    assert json.loads((folder / "config.json").read_text())["vocab_size"] == 30
    refused = config_check(tmp_path, {"input": str(PROTEINS), "model": str(folder)})
    assert the_one_refusal(refused) == (
        f"esmshard: {folder / 'vocab.txt'}: the tokenizer numbers the A token 30, beyond the "
        "model's 30 token embeddings (config.json's vocab_size): it is another model's "
        "tokenizer; use the one saved with these weights"
    )
