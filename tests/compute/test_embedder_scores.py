"""Language-model scores on real proteins (random weights, ESM-2's real t6 shape): logits and
masked marginals as fair-esm's own forward pass gives them, packed or padded, however the masked
copies are batched, and the pseudo-log-likelihood from them."""

import copy

import numpy as np
import pytest
import torch
from helpers import PROTEOME, TINY_MODEL, read_records

from esmshard import models
from esmshard.compute.batching import make_batches
from esmshard.compute.embedder import Embedder
from esmshard.compute.precision import PRECISIONS
from esmshard.embeddings_h5.scores import AMINO_ACIDS, residue_columns

# Short real proteins (a pass per residue each), one with an X.
SEQUENCES = [s for _, s in read_records(PROTEOME) if 30 <= len(s) <= 60][:4]
SCORES = ("mean", "logits", "masked_marginals", "pll")


@pytest.fixture(scope="module")
def model():
    net, alphabet = models.load(models.parse_spec(f"random:{TINY_MODEL}"))
    torch.set_num_threads(2)
    return net, alphabet


def scored(model, sequences, packed, budget, fast_path=True) -> list:
    net, alphabet = model
    embedder = Embedder(
        net,
        alphabet,
        [6],
        torch.device("cpu"),
        PRECISIONS["fp32"],
        fast_path,
        kinds=SCORES,
        packed=packed,
        budget=budget,
    )
    return [rep[6] for rep in embedder.forward(sequences)]


def fair_esm_scores(model, sequence):
    """fair-esm's forward pass: the log-softmax of its logits, and with each position masked
    (predict.py's masked marginals), over the whole vocabulary."""
    net, alphabet = model
    _, _, toks = alphabet.get_batch_converter()([("x", sequence)])
    columns = [alphabet.get_idx(a) for a in AMINO_ACIDS]
    with torch.no_grad():
        logits = torch.log_softmax(net(toks)["logits"], -1)[0, 1 : len(sequence) + 1]
        masked = []
        for i in range(len(sequence)):
            copy = toks.clone()
            copy[0, i + 1] = alphabet.mask_idx
            masked.append(torch.log_softmax(net(copy)["logits"], -1)[0, i + 1])
    masked = torch.stack(masked)
    own = masked[torch.arange(len(sequence)), toks[0, 1 : len(sequence) + 1]]
    return logits[:, columns].numpy(), masked[:, columns].numpy(), own.numpy()


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_logits_and_masked_marginals_equal_fair_esm_forward_pass(model, packed):
    # a budget of about three copies: each pass mixes the copies of two proteins
    got = scored(model, SEQUENCES, packed, budget=150)
    for sequence, rep in zip(SEQUENCES, got):
        logits, masked, own = fair_esm_scores(model, sequence)
        assert rep.logits.shape == rep.masked_marginals.shape == (len(sequence), 20)
        np.testing.assert_allclose(rep.logits, logits, atol=1e-4, rtol=0)
        np.testing.assert_allclose(rep.masked_marginals, masked, atol=1e-4, rtol=0)
        np.testing.assert_allclose(rep.pll, [own.sum(), own.mean()], rtol=1e-6)


def test_packed_and_padded_masked_marginals_agree_whatever_the_batches(model):
    """Within the packing tolerance of the representations (1e-5, test_esm2), carried
    through a head whose logits reach ~50 under random weights: measured up to 2.6e-5."""
    padded = scored(model, SEQUENCES, False, budget=4096)
    for packed, budget in ((True, 4096), (True, 150), (False, 62)):  # 62: a copy per pass
        for a, b in zip(padded, scored(model, SEQUENCES, packed, budget)):
            for kind in ("logits", "masked_marginals", "pll"):
                got, want = getattr(b, kind), getattr(a, kind)
                np.testing.assert_allclose(got, want, atol=5e-5, rtol=1e-5)


def test_the_pll_is_the_masked_marginals_at_the_sequences_own_residues(model):
    for sequence, rep in zip(SEQUENCES, scored(model, SEQUENCES, True, 4096)):
        columns = residue_columns(sequence)
        assert (columns >= 0).all()  # standard residues: every one is a column
        own = rep.masked_marginals[np.arange(len(sequence)), columns]
        np.testing.assert_allclose(rep.pll, [own.sum(), own.sum() / len(sequence)], rtol=1e-5)


def test_fair_esm_own_forward_pass_gives_the_same_scores(model):
    fast, own = (
        scored(model, SEQUENCES[:2], False, 4096),
        scored(model, SEQUENCES[:2], False, 4096, fast_path=False),
    )
    for a, b in zip(fast, own):
        np.testing.assert_allclose(a.masked_marginals, b.masked_marginals, atol=1e-4, rtol=0)
        np.testing.assert_allclose(a.logits, b.logits, atol=1e-4, rtol=0)


def test_a_batch_with_masked_marginals_holds_about_a_budget_of_masked_tokens():
    lengths = [100, 50, 50, 10]
    # 100 residues: 101 passes of 102 tokens, over the budget alone; 50: 51 × 52 = 2,652 each; 10: 132
    assert make_batches(lengths, 5400, packed=True, masked=True) == [[0], [1, 2], [3]]
    assert make_batches(lengths, 5400, packed=True) == [[0, 1, 2, 3]]


def test_scores_need_the_language_model_head():
    from esmshard.models.esmc import ALPHABET, ESMC, Shape
    from esmshard.models.spec import Arch

    headless = ESMC(Shape(Arch(1, 64, 4), 128), head=False)  # EsmcModel's files: no head
    with pytest.raises(ValueError, match="language-model head"):
        Embedder(headless, ALPHABET, [1], torch.device("cpu"), PRECISIONS["fp32"], kinds=["pll"])


@pytest.mark.parametrize("heads", ["mean", "all"])
def test_attention_maps_are_fair_esms_attention_weights(model, heads):
    """The layers asked for, each head or their mean, residues only: of a padded batch of
    proteins of several lengths, as fair-esm gives each protein alone."""
    from esmshard.embeddings_h5 import attentions

    net, alphabet = model
    asked = attentions.Asked([1, 6], heads)
    embedder = Embedder(net, alphabet, [6], torch.device("cpu"), PRECISIONS["fp32"],
                        kinds=["mean", "attentions"], attentions=asked)  # fmt: skip
    for sequence, rep in zip(SEQUENCES, embedder.forward(SEQUENCES)):
        _, _, toks = alphabet.get_batch_converter()([("x", sequence)])
        with torch.no_grad():
            want = net(toks, need_head_weights=True)["attentions"][0, [0, 5], :, 1:-1, 1:-1]
        want = want.mean(1, keepdim=True) if heads == "mean" else want
        got = attentions.maps(rep[6].attentions, len(sequence), 2)
        assert got.shape == (2, 20 if heads == "all" else 1, len(sequence), len(sequence))
        np.testing.assert_allclose(got, want.numpy(), atol=1e-6, rtol=0)


ON_A_GPU = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def relative_error(got, want) -> float:
    return float(np.abs(got - want).mean() / np.abs(want).mean())


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("device", [pytest.param("cuda", marks=ON_A_GPU)])
def test_scores_on_a_gpu_are_the_cpus_within_the_precisions_error(model, device, precision,
                                                                   packed):  # fmt: skip
    """The masked copies on a GPU (packed bf16: flash attention over the copies, the head's
    weights in bf16) against the CPU's fp32 scores of the same proteins."""
    net, alphabet = model
    want = scored(model, SEQUENCES, packed, budget=150)
    gpu = Embedder(copy.deepcopy(net), alphabet, [6], torch.device(device),
                   PRECISIONS[precision], kinds=SCORES, packed=packed, budget=150)  # fmt: skip
    got = [rep[6] for rep in gpu.forward(SEQUENCES)]
    for a, b in zip(got, want):
        for kind in ("logits", "masked_marginals", "pll"):
            if precision == "fp32":
                np.testing.assert_allclose(getattr(a, kind), getattr(b, kind), atol=1e-3,
                                           rtol=1e-5, err_msg=kind)  # fmt: skip
            else:  # bf16 keeps 8 bits of mantissa: an error of about 1e-2 of the values
                assert 0 < relative_error(getattr(a, kind), getattr(b, kind)) < 0.03, kind


@pytest.mark.parametrize("device", [pytest.param("cuda", marks=ON_A_GPU)])
def test_attention_maps_on_a_gpu_are_the_cpus_in_bf16(model, device):
    from esmshard.embeddings_h5 import attentions

    net, alphabet = model
    asked = attentions.Asked([1, 6], "all")
    maps = []
    for where, precision in (("cpu", "fp32"), (device, "bf16")):
        embedder = Embedder(copy.deepcopy(net), alphabet, [6], torch.device(where),
                            PRECISIONS[precision], kinds=["mean", "attentions"],
                            attentions=asked)  # fmt: skip
        maps.append([rep[6].attentions for rep in embedder.forward(SEQUENCES)])
    for want, got in zip(*maps):
        assert got.dtype == want.dtype and got.shape == want.shape
        # attention weights lie in [0, 1]: bf16's error is absolute
        assert np.abs(got.astype(np.float32) - want.astype(np.float32)).max() < 0.02
