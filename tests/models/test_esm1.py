"""ESM-1b and ESM-1v: fair-esm's checkpoints of their real width, through `esmshard.embed` (the
workflow's shard, embed and merge steps in this process; esmshard's fast forward pass, packed),
against fair-esm's own loader and forward pass, one protein at a time as its extract script runs
them; the refusals, by the config check that the Snakefile runs."""

import argparse
import shutil
from pathlib import Path

import esm
import numpy as np
import pytest
import torch
from helpers import PROTEINS, config_check, read_records, the_one_refusal

import esmshard
from esmshard.models import ESM1, parse_spec
from esmshard.models.esm1 import build, write_checkpoint
from esmshard.models.esm2_files import regression_path
from esmshard.models.spec import Arch

# The published width (D = 1280, 20 heads), two of the 33 layers.
ARCH = Arch(2, 1280, 20)


def checkpoint(folder, name):
    """fair-esm's files of `name` (ESM-1b's with its contact regression, ESM-1v's without), random
    weights of the real width; their layer norms moved away from 1, so that one left out shows."""
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = build(ARCH)
        with torch.no_grad():
            for key, tensor in model.named_parameters():
                if "layer_norm" in key:
                    tensor.add_(torch.randn_like(tensor) * 0.3)
    return write_checkpoint(model, folder, name)


@pytest.fixture(scope="module")
def published(tmp_path_factory) -> dict[str, Path]:
    """ESM-1b's and ESM-1v's files (`checkpoint`), written once: the tests only read them."""
    folder = tmp_path_factory.mktemp("published")
    return {
        name: checkpoint(folder, name)
        for name in ("esm1b_t33_650M_UR50S", "esm1v_t33_650M_UR90S_1")
    }


def fair_esm(path, sequences):
    """fair-esm's per-residue rows of the last layer, each protein alone (its extract script)."""
    with torch.serialization.safe_globals([argparse.Namespace]):
        model, alphabet = esm.pretrained.load_model_and_alphabet_local(str(path))
    model.eval()
    convert = alphabet.get_batch_converter()
    rows = []
    with torch.inference_mode():
        for sequence in sequences:
            _, _, tokens = convert([("p", sequence)])
            out = model(tokens, repr_layers=[ARCH.layers])["representations"][ARCH.layers]
            rows.append(out[0, 1 : len(sequence) + 1].numpy())
    return rows


@pytest.mark.parametrize("batching", ["padded", "packed"])
def test_the_fast_path_gives_fair_esms_every_layer(batching):
    """ESM-1b's layers are ESM-2's: esmshard's fast forward pass (fused attention, packed
    batches) with its learned positions, the layer norm before the layers and token dropout's
    scaling gives fair-esm's own numbers, padded and packed."""
    from esmshard.compute.embedder import Embedder
    from esmshard.compute.precision import PRECISIONS
    from esmshard.models.esm2 import FastESM2

    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = build(Arch(3, 64, 4)).eval()
        with torch.no_grad():
            for key, tensor in model.named_parameters():
                if "layer_norm" in key:
                    tensor.add_(torch.randn_like(tensor) * 0.3)
    sequences = [s[:300] for _, s in read_records(PROTEINS)[:6]]
    _, _, tokens = model.alphabet.get_batch_converter()([("p", s) for s in sequences])
    with torch.inference_mode():
        want = model(tokens, repr_layers=[0, 1, 3])["representations"]
    embedder = Embedder(model, model.alphabet, [0, 1, 3], torch.device("cpu"), PRECISIONS["fp32"],
                        kinds=("per_tok", "mean"), packed=batching == "packed")  # fmt: skip
    assert isinstance(embedder.net, FastESM2) and embedder.batching == batching
    for row, rep in enumerate(embedder.forward(sequences)):
        for layer in (0, 1, 3):
            rows = want[layer][row, 1 : len(sequences[row]) + 1].numpy()
            np.testing.assert_allclose(rep[layer].per_tok, rows, atol=1e-5, rtol=0)
            np.testing.assert_allclose(rep[layer].mean, rows.mean(0), atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", ["esm1b_t33_650M_UR50S", "esm1v_t33_650M_UR90S_1"])
def test_fair_esm_checkpoints_equal_fair_esm(tmp_path, name, published):
    path = published[name]
    spec = parse_spec(str(path))
    assert (spec.family, spec.arch) == (ESM1, ARCH)
    records = [(h[1:].split()[0], s[:1022]) for h, s in read_records(PROTEINS)][::4]
    fasta = tmp_path / "proteins.fasta"
    fasta.write_text("".join(f">{id_}\n{s}\n" for id_, s in records))
    want = fair_esm(path, [s for _, s in records])
    with esmshard.embed(fasta, str(path), include=["mean", "per_tok"], precision="fp32") as emb:
        assert emb.h5.attrs["model_family"] == "esm1"
        for (id_, _), rows in zip(records, want):
            np.testing.assert_allclose(emb[id_].per_tok[2], rows, atol=1e-4, rtol=0)
            np.testing.assert_allclose(emb[id_].mean[2], rows.mean(0), atol=1e-4, rtol=0)


def test_esm1b_contact_maps_equal_fair_esm_and_esm1v_ones_are_refused_before_any_job(
    tmp_path, published
):
    path = published["esm1b_t33_650M_UR50S"]
    records = [(h[1:].split()[0], s[:1022]) for h, s in read_records(PROTEINS)][::8]
    fasta = tmp_path / "proteins.fasta"
    fasta.write_text("".join(f">{id_}\n{s}\n" for id_, s in records))
    with torch.serialization.safe_globals([argparse.Namespace]):
        model, alphabet = esm.pretrained.load_model_and_alphabet_local(str(path))
    convert = alphabet.get_batch_converter()
    with esmshard.embed(fasta, str(path), include=["contacts"], precision="fp32",
                        contacts_dtype="float32") as emb:  # fmt: skip
        for id_, sequence in records:
            _, _, tokens = convert([("p", sequence)])
            with torch.inference_mode():
                want = model.eval()(tokens, return_contacts=True)["contacts"][0].numpy()
            np.testing.assert_allclose(emb.contact_map(id_), want, atol=1e-4, rtol=0)

    refused = config_check(tmp_path / "esm1v", {"input": str(PROTEINS), "include": ["contacts"],
                                                "model": "random:esm1v_t33_650M_UR90S_1"})  # fmt: skip
    assert (
        "include: contacts: esm1v_t33_650M_UR90S_1 has no contact-regression weights (ESM-1v's "
        "checkpoints have none)"
    ) in the_one_refusal(refused)
    assert not (tmp_path / "esm1v" / "results" / "shards").exists()


def test_esm1v_scores_equal_fair_esm(tmp_path, published):
    """ESM-1v, the variant-effect model: its logits and masked marginals (its head over the
    fast path's last layer, packed masked copies) as fair-esm's forward pass gives them."""
    from esmshard.embeddings_h5.scores import AMINO_ACIDS

    path = published["esm1v_t33_650M_UR90S_1"]
    records = [(h[1:].split()[0], s) for h, s in read_records(PROTEINS) if len(s) <= 90][:2]
    fasta = tmp_path / "proteins.fasta"
    fasta.write_text("".join(f">{id_}\n{s}\n" for id_, s in records))
    with torch.serialization.safe_globals([argparse.Namespace]):
        model, alphabet = esm.pretrained.load_model_and_alphabet_local(str(path))
    model.eval()
    columns = [alphabet.get_idx(a) for a in AMINO_ACIDS]
    with esmshard.embed(fasta, str(path), include=["logits", "masked_marginals"],
                        precision="fp32") as emb:  # fmt: skip
        for id_, sequence in records:
            _, _, tokens = alphabet.get_batch_converter()([("p", sequence)])
            n = len(sequence)
            copies = tokens.repeat(n, 1)
            copies[torch.arange(n), torch.arange(n) + 1] = alphabet.mask_idx
            with torch.inference_mode():
                logits = torch.log_softmax(model(tokens)["logits"], -1)[0, 1 : n + 1]
                masked = torch.log_softmax(model(copies)["logits"], -1)
            masked = masked[torch.arange(n), torch.arange(n) + 1]
            got = emb[id_].scores
            # random weights of this width (and moved layer norms) give log-probabilities down
            # to -140: fp32's rounding of them alone is 1e-5, hence the relative term
            for kind, want in (("logits", logits), ("masked_marginals", masked)):
                np.testing.assert_allclose(got[kind], want[:, columns], atol=1e-4, rtol=2e-6)


def test_checkpoints_are_told_by_their_contents_whatever_their_files_are_called(
    tmp_path, published
):
    """ESM-1b saved as `esm2_lab_model.pt` (fair-esm's loader reads a name starting `esm2` as
    ESM-2's) and ESM-1v saved without `esm1v` in its name, with no contact-regression file (it
    has none): both run and give fair-esm's numbers of the same weights;
    ESM-1v's contact maps are refused before any job, naming the file that is not there."""
    records = [(h[1:].split()[0], s[:1022]) for h, s in read_records(PROTEINS)][::16]
    fasta = tmp_path / "proteins.fasta"
    fasta.write_text("".join(f">{id_}\n{s}\n" for id_, s in records))
    lab = tmp_path / "lab"
    lab.mkdir()
    for name, renamed in (("esm1b_t33_650M_UR50S", "esm2_lab_model"),
                          ("esm1v_t33_650M_UR90S_1", "variant_model")):  # fmt: skip
        original = published[name]
        path = lab / f"{renamed}.pt"
        shutil.copyfile(original, path)
        if name.startswith("esm1b"):
            shutil.copyfile(regression_path(original), regression_path(path))
        want = fair_esm(original, [s for _, s in records])
        with esmshard.embed(fasta, str(path), include=["mean", "per_tok"],
                            precision="fp32") as emb:  # fmt: skip
            assert emb.h5.attrs["model_family"] == "esm1"
            for (id_, _), rows in zip(records, want):
                np.testing.assert_allclose(emb[id_].per_tok[2], rows, atol=1e-4, rtol=0)
    refused = config_check(tmp_path / "contacts", {}, "--config", f"input={fasta}",
                           f"model={lab / 'variant_model.pt'}", "include=[contacts]")  # fmt: skip
    assert (
        f"include: contacts: variant_model has no contact-regression weights "
        f"({lab / 'variant_model-contact-regression.pt'} is not beside it) (ESM-1v's checkpoints "
        "have none)"
    ) in the_one_refusal(refused)
    assert not (tmp_path / "contacts" / "results" / "shards").exists()


def test_a_checkpoint_whose_config_disagrees_with_its_tensors_is_one_line_before_any_job(
    tmp_path, published
):
    original = published["esm1b_t33_650M_UR50S"]
    path = tmp_path / original.name
    shutil.copyfile(regression_path(original), regression_path(path))
    data = torch.load(original, weights_only=False)
    data["args"].encoder_embed_dim = 960  # its tensors are 1280 wide
    torch.save(data, path)
    refused = config_check(tmp_path, {"input": str(PROTEINS), "model": str(path)})
    assert the_one_refusal(refused).startswith(
        f"esmshard: {path}: tensor embed_tokens.weight is [33, 1280] in the weights, where the "
        "ESM-1b/1v of 2 layers and dimension 960 that its config says has [33, 960]"
    )
