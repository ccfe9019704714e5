"""esmshard's forward pass against fair-esm's model, same weights, same tokens."""

import numpy as np
import pytest
import torch
from conftest import PROTEINS, read_records

from esmshard.compute.batching import make_batches
from esmshard.compute.embedder import Embedder
from esmshard.compute.precision import PRECISIONS
from esmshard.models import layers
from esmshard.models.esm2 import FastESM2, random_model

SEQUENCES = [seq[:1022] for _, seq in read_records(PROTEINS)]
# Per sequence, CPU autocast, random weights (measured: >= 0.99999 in bf16, fp16 closer still).
BF16_MIN_COSINE = 0.9999


@pytest.fixture(scope="module")
def model():
    torch.set_num_threads(2)
    return random_model("esm2_t6_8M_UR50D").eval()


def embedder(model, fast, precision="fp32"):
    return Embedder(
        model,
        model.alphabet,
        [0, 3, 6],
        torch.device("cpu"),
        PRECISIONS[precision],
        fast_path=fast,
    )


@pytest.mark.parametrize("dense", ["onednn", "torch"])
@pytest.mark.parametrize("budget", [600, 2048, 6000])
def test_fast_path_equals_fair_esm_with_padding(model, budget, dense, monkeypatch):
    if dense == "torch":  # the path GPUs, autocast and torch builds without oneDNN take
        monkeypatch.setattr(layers, "onednn_available", lambda: False)
    fast, reference = embedder(model, True), embedder(model, False)
    lengths = [len(s) for s in SEQUENCES]
    batches = make_batches(lengths, budget)[:4] + make_batches(lengths, budget)[-2:]
    assert any(len(b) > 1 for b in batches) and any(lengths[b[0]] == 1022 for b in batches)
    for batch in batches:
        seqs = [SEQUENCES[i] for i in batch]
        for got, want in zip(fast.forward(seqs), reference.forward(seqs)):
            for layer in (0, 3, 6):
                assert np.abs(got[layer].per_tok - want[layer].per_tok).max() <= 1e-4
                assert np.abs(got[layer].bos - want[layer].bos).max() <= 1e-4


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="this torch has no oneDNN")
def test_onednn_dense_layers_are_used_on_cpu():
    assert layers.onednn_available()


def test_layers_above_the_highest_requested_are_not_run(model):
    ran = []
    hooks = [
        layer.final_layer_norm.register_forward_pre_hook(lambda *_, i=i: ran.append(i))
        for i, layer in enumerate(model.layers)
    ]
    toks = embedder(model, True).tokens(SEQUENCES[:2])
    try:
        with torch.inference_mode():
            reps = FastESM2(model)(toks, repr_layers=[2])["representations"]
    finally:
        for hook in hooks:
            hook.remove()
    assert ran == [0, 1] and list(reps) == [2]
    with torch.inference_mode():
        want = model(toks, repr_layers=[2])["representations"][2]
    np.testing.assert_allclose(reps[2].numpy(), want.numpy(), atol=1e-4)


def cosines(got, want, layer) -> list[float]:
    """Per sequence, the cosine of the two means at `layer`."""
    return [
        float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))
        for a, b in ((g[layer].mean, w[layer].mean) for g, w in zip(got, want))
    ]


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_half_precision_on_cpu_stays_close_for_every_protein(model, precision):
    """The whole path a GPU takes in half precision (autocast, the fast path, the reductions and
    read-back, the non-finite check), on the CPU: every real protein's mean against fp32's."""
    half, reference = embedder(model, True, precision), embedder(model, True)
    batches = make_batches([len(s) for s in SEQUENCES], 4096)
    got, want, failed = {}, {}, []
    for batch in batches:
        seqs = [SEQUENCES[i] for i in batch]
        for out, emb in ((got, half), (want, reference)):
            for done, reps in emb.embed(batch, seqs, failed):
                out.update(zip(done, reps))
    assert not failed and sorted(got) == sorted(want) == list(range(len(SEQUENCES)))
    order = sorted(got)
    for layer in (3, 6):
        assert min(cosines([got[i] for i in order], [want[i] for i in order], layer)) >= (
            BF16_MIN_COSINE
        )
    # autocast took effect: half precision does not give fp32's numbers
    assert any(not np.array_equal(got[i][6].mean, want[i][6].mean) for i in order)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_bf16_on_gpu_cosine_at_least_0999(model):
    device = torch.device("cuda")
    fast = Embedder(model, model.alphabet, [6], device, PRECISIONS["bf16"])
    reference = Embedder(
        random_model("esm2_t6_8M_UR50D").eval(),
        model.alphabet,
        [6],
        device,
        PRECISIONS["fp32"],
        fast_path=False,
    )
    assert min(cosines(fast.forward(SEQUENCES), reference.forward(SEQUENCES), 6)) >= 0.999
