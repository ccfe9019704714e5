"""esmshard's forward pass against fair-esm's model, same weights, same tokens."""

import copy

import numpy as np
import pytest
import torch
from helpers import PROTEINS, read_records

from esmshard.compute.batching import make_batches
from esmshard.compute.embedder import Embedder
from esmshard.compute.precision import FP8_CAPABILITY, PRECISIONS
from esmshard.models import layers
from esmshard.models.esm2 import FastESM2, random_model

SEQUENCES = [seq[:1022] for _, seq in read_records(PROTEINS)]
# Per sequence, CPU autocast, random weights (measured: >= 0.99999 in bf16, fp16 closer still).
BF16_MIN_COSINE = 0.9999


@pytest.fixture(scope="module")
def model():
    torch.set_num_threads(2)
    return random_model("esm2_t6_8M_UR50D").eval()


def embedder(model, fast, precision="fp32", packed=False):
    return Embedder(
        model,
        model.alphabet,
        [0, 3, 6],
        torch.device("cpu"),
        PRECISIONS[precision],
        fast_path=fast,
        packed=packed,
    )


_FAIR_ESM_OUTPUTS = {}


def fair_esm_outputs(model, batch: tuple[int, ...]):
    """fair-esm's own forward of a batch of SEQUENCES, computed once for every case that needs it."""
    if batch not in _FAIR_ESM_OUTPUTS:
        reference = embedder(model, False)
        _FAIR_ESM_OUTPUTS[batch] = reference.forward([SEQUENCES[i] for i in batch])
    return _FAIR_ESM_OUTPUTS[batch]


@pytest.mark.parametrize("dense", ["onednn", "torch"])
@pytest.mark.parametrize(
    "budget, batching",
    [(600, "padded"), (2048, "padded"), (600, "packed"), (2048, "packed")],
)
def test_fast_path_equals_fair_esm(model, budget, dense, batching, monkeypatch):
    if dense == "torch":  # the path GPUs, autocast and torch builds without oneDNN take
        monkeypatch.setattr(layers, "onednn_available", lambda: False)
    packed = batching == "packed"
    fast = embedder(model, True, packed=packed)
    assert fast.packed == packed
    lengths = [len(s) for s in SEQUENCES]
    planned = make_batches(lengths, budget, packed)
    batches = planned[:4] + planned[-2:]
    assert any(len(b) > 1 for b in batches) and any(lengths[b[0]] == 1022 for b in batches)
    for batch in batches:
        seqs = [SEQUENCES[i] for i in batch]
        for got, want in zip(fast.forward(seqs), fair_esm_outputs(model, tuple(batch))):
            for layer in (0, 3, 6):
                assert np.abs(got[layer].per_tok - want[layer].per_tok).max() <= 1e-4
                assert np.abs(got[layer].bos - want[layer].bos).max() <= 1e-4


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="this torch has no oneDNN")
def test_onednn_dense_layers_are_used_on_cpu(model, monkeypatch):
    # Each of the 6 layers' four dense products (q-k-v, the attention's output, the GELU and
    # the residual one) goes through oneDNN in fp32 on a CPU; under autocast none does.
    assert layers.onednn_available()
    calls = []
    real = layers.onednn_dense

    def counted(*args, **kwargs):
        calls.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(layers, "onednn_dense", counted)
    embedder(model, True).forward(SEQUENCES[:2])
    assert len(calls) == 6 * 4
    assert sum(bool(kw.get("gelu")) for kw in calls) == 6
    calls.clear()
    embedder(model, True, "bf16").forward(SEQUENCES[:2])
    assert calls == []


@pytest.mark.parametrize("shape", [(7, 32), (2, 5, 32)], ids=["packed", "padded"])
def test_the_gelu_epilogue_product_takes_the_compute_dtype_and_keeps_the_leading_dims(shape):
    # On a CPU torch applies the exact GELU after the product: the same numbers as fair-esm's
    # layer in bf16; CUDA's tanh-form epilogue is measured by tests/compute/test_gpu.py.
    linear = torch.nn.Linear(32, 64).requires_grad_(False)
    x = torch.randn(*shape)
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
        got = layers.epilogue_gelu_dense(x, linear)
        want = torch.nn.functional.gelu(linear(x))
    assert got.dtype == torch.bfloat16 and got.shape == (*shape[:-1], 64)
    assert torch.equal(got, want)


def test_q_k_v_are_one_product_whose_weights_fair_esm_shares():
    model = random_model("esm2_t6_8M_UR50D").eval()
    before = [layer.self_attn.v_proj.weight.clone() for layer in model.layers]
    fast = FastESM2(model)
    for layer, fused, v in zip(model.layers, fast.qkv, before):
        attn = layer.self_attn
        assert attn.q_proj.weight.data_ptr() == fused.weight.data_ptr()  # a view: no copy
        assert attn.v_proj.weight.untyped_storage().data_ptr() == fused.weight.data_ptr()
        assert torch.equal(attn.v_proj.weight, v) and torch.equal(fused.weight[-320:], v)


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


def by_sequence(emb, batches) -> dict:
    """Each sequence's representations, embedded in `batches` (lists of indices)."""
    out, failed = {}, []
    for batch in batches:
        for done, reps in emb.embed(batch, [SEQUENCES[i] for i in batch], failed):
            out.update(zip(done, reps))
    assert not failed and sorted(out) == list(range(len(SEQUENCES)))
    return out


def largest_difference(got: dict, want: dict) -> float:
    return max(
        float(np.abs(getattr(got[i][layer], kind) - getattr(want[i][layer], kind)).max())
        for i in got
        for layer in (0, 3, 6)
        for kind in ("per_tok", "bos", "mean")
    )


def test_packed_batches_equal_padded_ones_and_do_not_depend_on_their_neighbours(model):
    """Every real protein (1022-residue ones among them), every kind, at three layers."""
    lengths = [len(s) for s in SEQUENCES]
    packed = embedder(model, True, packed=True)
    together = by_sequence(packed, make_batches(lengths, 4096, packed=True))
    assert largest_difference(together, fp32_by_sequence(model)) <= 1e-5  # padded batches
    # Alone, or in a batch of other neighbours (the order reversed): measured 0 to 4e-6 on
    # this CPU (the dense layers' sums run in blocks that depend on the batch's size).
    alone = by_sequence(packed, [[i] for i in range(len(SEQUENCES))])
    assert largest_difference(together, alone) <= 1e-5
    reversed_ = by_sequence(packed, [b[::-1] for b in make_batches(lengths[::-1], 3000, True)])
    assert largest_difference(together, reversed_) <= 1e-5


def test_a_packed_batch_attends_within_each_sequence_at_its_own_positions():
    tokens, counts = np.arange(9), np.array([2, 4, 3])
    packed = layers.Packed.of(tokens, counts, torch.from_numpy)
    assert packed.bounds.tolist() == [0, 2, 6, 9] and packed.longest == 64
    assert packed.positions.tolist() == [0, 1, 0, 1, 2, 3, 0, 1, 2]
    assert packed.sequence_of.tolist() == [0, 0, 1, 1, 1, 1, 2, 2, 2]
    q, k, v = torch.randn(3, 9, 2, 8).unbind(0)
    out = layers.packed_attention(q, k, v, packed, scale=0.3)
    for start, end in ((0, 2), (2, 6), (6, 9)):
        alone = torch.nn.functional.scaled_dot_product_attention(
            *(t[start:end].transpose(0, 1) for t in (q, k, v)), scale=0.3
        ).transpose(0, 1)
        torch.testing.assert_close(out[start:end], alone, atol=1e-6, rtol=0)


_FP32_BY_SEQUENCE = {}


def fp32_by_sequence(model) -> dict:
    """Each sequence's fp32 representations by the fast path in padded batches of 4096 tokens,
    computed once for the module."""
    if not _FP32_BY_SEQUENCE:
        lengths = [len(s) for s in SEQUENCES]
        _FP32_BY_SEQUENCE.update(by_sequence(embedder(model, True), make_batches(lengths, 4096)))
    return _FP32_BY_SEQUENCE


def cosines(got, want, layer) -> list[float]:
    """Per sequence, the cosine of the two means at `layer`."""
    return [
        float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))
        for a, b in ((g[layer].mean, w[layer].mean) for g, w in zip(got, want))
    ]


# fp16 once: its products are three times bf16's time on a CPU, and the batching is bf16's test
@pytest.mark.parametrize(
    "precision, batching", [("bf16", "padded"), ("bf16", "packed"), ("fp16", "packed")]
)
def test_half_precision_on_cpu_stays_close_for_every_protein(model, precision, batching):
    """The whole path a GPU takes in half precision (autocast, the fast path, the reductions and
    read-back, the non-finite check), on the CPU: every real protein's mean against fp32's."""
    packed = batching == "packed"
    half = embedder(model, True, precision, packed)
    got = by_sequence(half, make_batches([len(s) for s in SEQUENCES], 4096, packed))
    want = fp32_by_sequence(model)
    order = sorted(got)
    for layer in (3, 6):
        assert min(cosines([got[i] for i in order], [want[i] for i in order], layer)) >= (
            BF16_MIN_COSINE
        )
    # autocast took effect: half precision does not give fp32's numbers
    assert any(not np.array_equal(got[i][6].mean, want[i][6].mean) for i in order)


def test_an_fp8_product_is_its_scaled_fp8_operands_product_rounded_once():
    """`fp8_dense`: each row of the input and of the weight in FP8 with a scale of its own (rows
    of magnitudes 1e-2 to 1e2 alike), multiplied with fp32 accumulation, the bias added and one
    rounding to bf16; GELU and the residual after it, as torch_dense applies them."""
    torch.manual_seed(0)
    linear = torch.nn.Linear(64, 48)
    x = torch.randn(3, 5, 64) * torch.logspace(-2, 2, 5)[None, :, None]
    exact = linear(x).detach()
    layers.to_fp8(linear)
    assert linear.weight.dtype == layers.FP8 and linear.weight_scale.shape == (1, 48)
    rows, scale = layers.fp8_rows(x.reshape(-1, 64))
    weight = linear.weight.float() * linear.weight_scale.t()
    expected = (rows.float() * scale) @ weight.t() + linear.bias.float()
    got = layers.fp8_dense(x, linear)
    assert got.dtype == torch.bfloat16 and got.shape == (3, 5, 48)
    per_row = (got.reshape(-1, 48).float() - expected).abs() / expected.abs().amax(1, keepdim=True)
    assert float(per_row.max()) <= 2**-7  # bf16's rounding, once
    # FP8's own rounding of the operands: a few percent of a product, never more
    error = (got.float() - exact).norm(dim=-1) / exact.norm(dim=-1)
    assert 0 < float(error.max()) < 0.05
    residual = torch.randn(3, 5, 48)
    torch.testing.assert_close(
        layers.fp8_dense(x, linear, gelu=True, residual=residual),
        residual + torch.nn.functional.gelu(got),
    )


# Measured 0.9985 (the least protein's mean) on esm2_t6's shape with random weights; real
# weights' error, against the goals of p1 0.999 and 0.9997, is `make gpu-check`'s to measure.
FP8_MIN_COSINE = 0.997


@pytest.mark.parametrize("batching", ["padded", "packed"])
def test_fp8_on_cpu_stays_close_for_every_protein(model, batching):
    """precision: fp8's whole path (every layer's dense products in FP8, the rest under bf16
    autocast) on the CPU: every real protein's mean against fp32's, the products in FP8."""
    packed = batching == "packed"
    fp8 = embedder(copy.deepcopy(model), True, "fp8", packed)  # it makes its products FP8
    assert all(linear.weight.dtype == layers.FP8 for linear in fp8.net.dense_products())
    got = by_sequence(fp8, make_batches([len(s) for s in SEQUENCES], 4096, packed))
    want = fp32_by_sequence(model)
    order = sorted(got)
    least = min(cosines([got[i] for i in order], [want[i] for i in order], 6))
    assert FP8_MIN_COSINE <= least < BF16_MIN_COSINE  # FP8's error, not bf16's


def test_products_left_out_of_fp8_are_computed_as_bf16_computes_them(model):
    """`use_fp8(products)`: those in FP8, the others as bf16 computes them (benchmarks/
    fp8_layers.py measures each kind's error so); `feed_forward_products` are fc1 and fc2."""
    seqs = [s for s in SEQUENCES if len(s) < 300][:4]
    bf16, none, feed_forward = (embedder(copy.deepcopy(model), True, "bf16") for _ in range(3))
    none.net.use_fp8([])
    products = feed_forward.net.dense_products()
    chosen = feed_forward.net.feed_forward_products()
    assert chosen == [p for i, p in enumerate(products) if i % 4 >= 2]  # each layer's fc1, fc2
    feed_forward.net.use_fp8(chosen)
    assert {p.weight.dtype for p in chosen} == {layers.FP8}
    assert layers.FP8 not in {p.weight.dtype for p in products if all(p is not c for c in chosen)}
    want, same, got = (e.forward(seqs) for e in (bf16, none, feed_forward))
    for w, s, g in zip(want, same, got):
        np.testing.assert_array_equal(s[6].mean, w[6].mean)
        assert not np.array_equal(g[6].mean, w[6].mean)


@pytest.mark.gpu
@pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability() < FP8_CAPABILITY,
    reason="needs a GPU that computes FP8 products (Hopper)",
)
@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_fp8_on_a_hopper_gpu_stays_close_for_every_protein(model, packed):
    device = torch.device("cuda")
    fp8 = Embedder(copy.deepcopy(model), model.alphabet, [6], device, PRECISIONS["fp8"],
                   packed=packed)  # fmt: skip
    fp32 = Embedder(copy.deepcopy(model), model.alphabet, [6], device, PRECISIONS["fp32"])
    assert min(cosines(fp8.forward(SEQUENCES), fp32.forward(SEQUENCES), 6)) >= FP8_MIN_COSINE


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


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_packed_bf16_on_gpu_takes_varlen_attention_and_matches_fp32(model):
    device = torch.device("cuda")
    packed = Embedder(model, model.alphabet, [6], device, PRECISIONS["bf16"], packed=True)
    reference = Embedder(model, model.alphabet, [6], device, PRECISIONS["fp32"])
    assert layers.varlen_available(torch.zeros(1, device=device, dtype=torch.bfloat16))
    lengths = [len(s) for s in SEQUENCES]
    got, want = {}, {}
    for out, emb, batches in (
        (got, packed, make_batches(lengths, 8192, packed=True)),
        (want, reference, make_batches(lengths, 8192)),
    ):
        for batch in batches:
            for done, reps in emb.embed(batch, [SEQUENCES[i] for i in batch], []):
                out.update(zip(done, reps))
    order = sorted(want)
    assert min(cosines([got[i] for i in order], [want[i] for i in order], 6)) >= 0.999
