"""The GPU behaviours, on a real CUDA device (`make gpu-check` runs them; they skip without one)."""

import logging

import numpy as np
import pytest
import torch
from helpers import PROTEINS, read_records

from esmshard.compute import telemetry
from esmshard.compute.batching import make_batches, token_budget
from esmshard.compute.embedder import Embedder
from esmshard.compute.precision import PRECISIONS, autocast, resolve
from esmshard.models.esm2 import random_model
from esmshard.models.layers import torch_dense

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
SEQUENCES = [seq[:1022] for _, seq in read_records(PROTEINS)]
CUDA = torch.device("cuda", 0)


@pytest.fixture(scope="module")
def net():
    return random_model("esm2_t12_35M_UR50D").eval().to(CUDA)


def test_autocast_computes_in_the_named_dtype_and_auto_picks_bf16_where_native():
    linear, x = torch.nn.Linear(8, 4).to(CUDA), torch.randn(2, 8, device=CUDA)
    for precision in PRECISIONS.values():
        with autocast(precision, CUDA):
            out = linear(x)
        want = getattr(torch, precision.autocast_dtype or "float32")
        assert out.dtype == want, precision.name
    native = torch.cuda.get_device_capability(CUDA) >= (8, 0)
    assert resolve("auto", CUDA).name == ("bf16" if native else "fp32")


def test_the_gelu_in_the_products_epilogue_is_nearer_fp32_than_gelu_after_a_bf16_product():
    # esm2_t33_650M's fc1: the epilogue rounds once, after its (tanh-form) GELU; the exact GELU
    # after the product rounds the product first and the GELU again.
    linear = torch.nn.Linear(1280, 5120).to(CUDA).requires_grad_(False)
    x = torch.randn(8192, 1280, device=CUDA)
    with torch.inference_mode():
        want = torch.nn.functional.gelu(linear(x))
        with autocast(PRECISIONS["bf16"], CUDA):
            epilogue = torch_dense(x, linear, gelu=True)
            after = torch.nn.functional.gelu(linear(x))
    assert epilogue.dtype == after.dtype == torch.bfloat16
    assert not torch.equal(epilogue, after), "no epilogue: the same numbers as GELU after"
    error, error_after = ((t.float() - want).abs().mean() for t in (epilogue, after))
    assert error <= error_after


def test_nvml_finds_the_cuda_device_by_its_pci_bus_id(tmp_path):
    sampler = telemetry.Sampler("0", tmp_path / "telemetry.tsv")
    assert sampler.bus_id is not None, "NVML did not answer"
    assert sampler.bus_id.upper().endswith(telemetry.cuda_pci_bus_id(0).upper()[-7:])
    assert sampler.name == torch.cuda.get_device_name(0)
    # NVML counts memory that the driver keeps for itself, CUDA does not
    total = torch.cuda.get_device_properties(0).total_memory
    assert total <= sampler.memory_total <= 1.02 * total


def test_the_auto_token_budget_fits_the_free_memory(net):
    torch.cuda.empty_cache()
    free = torch.cuda.mem_get_info(CUDA)[0]
    budget = token_budget("auto", CUDA, net, PRECISIONS["bf16"])
    tokens = budget(1024)
    assert tokens >= 1024
    longest = [s for s in SEQUENCES if len(s) == 1022]
    batch = (longest * (tokens // 1024 // len(longest) + 1))[: tokens // 1024]
    embedder = Embedder(net, net.alphabet, [12], CUDA, PRECISIONS["bf16"], kinds=["mean"])
    torch.cuda.reset_peak_memory_stats(CUDA)
    base = torch.cuda.memory_allocated(CUDA)
    failed = []
    embedder.embed(list(range(len(batch))), batch, failed)
    peak = torch.cuda.max_memory_allocated(CUDA) - base
    assert not failed
    assert peak <= 0.8 * free, f"a batch of {tokens} tokens took {peak} of {free} free bytes"


def test_a_real_out_of_memory_is_halved_with_the_results_of_a_whole_batch(net, caplog):
    embedder = Embedder(net, net.alphabet, [6, 12], CUDA, PRECISIONS["fp32"])
    batch = SEQUENCES[:16]
    indices = list(range(len(batch)))

    def run():
        failed, out = [], {}
        for done, reps in embedder.embed(indices, batch, failed):
            out.update(zip(done, reps))
        return out, failed

    # A warm run first, so that what the batch needs is its own, without the libraries'
    # one-time workspaces (on an H200 the room left from a cold run's figure once held it all).
    run()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(CUDA)
    base = torch.cuda.memory_allocated(CUDA)
    whole, failed = run()
    need = torch.cuda.max_memory_allocated(CUDA) - base
    assert not failed
    torch.cuda.empty_cache()
    # Leave room for about 60% of what the whole batch took: it fails, its halves fit.
    hog = torch.empty(
        torch.cuda.mem_get_info(CUDA)[0] - int(0.6 * need), dtype=torch.uint8, device=CUDA
    )
    try:
        with caplog.at_level(logging.WARNING):
            halved, failed = run()
    finally:
        del hog
        torch.cuda.empty_cache()
    assert "retrying as two halves" in caplog.text, "the batch did not run out of memory"
    assert not failed and sorted(halved) == indices
    for i in indices:
        for layer in (6, 12):
            np.testing.assert_allclose(halved[i][layer].mean, whole[i][layer].mean, atol=1e-5)
            np.testing.assert_allclose(
                halved[i][layer].per_tok, whole[i][layer].per_tok, atol=1e-5
            )


def test_read_back_is_pinned_and_the_next_batch_is_launched_before_the_last_is_read(
    net, monkeypatch
):
    # fp32 batches of 32k tokens: each takes the device far longer than the host takes to queue it
    embedder = Embedder(net, net.alphabet, [12], CUDA, PRECISIONS["fp32"], kinds=["mean", "bos"])
    sequences = SEQUENCES * 4
    batches = make_batches([len(s) for s in sequences], 32768)
    events = []
    launch, finish = Embedder.launch, Embedder.finish

    def launching(self, sequences, kinds=None):
        launched = launch(self, sequences, kinds)
        assert all(value.is_pinned() for value in launched.values.values())
        events.append(("launch", len(sequences), launched.copied.query()))
        return launched

    def finishing(self, launched):
        events.append(("finish", len(launched.lengths), None))
        return finish(self, launched)

    monkeypatch.setattr(Embedder, "launch", launching)
    monkeypatch.setattr(Embedder, "finish", finishing)
    jobs = [(b, [sequences[i] for i in b]) for b in batches]
    results = list(embedder.embed_batches(iter(jobs), []))
    assert len(results) == len(batches) > 2
    kinds = [kind for kind, _, _ in events]
    # launch 1, launch 2, finish 1, launch 3, finish 2, ...: one batch always queued ahead
    assert kinds == ["launch", "launch"] + ["finish", "launch"] * (len(batches) - 2) + [
        "finish",
        "finish",
    ]
    # the host got control back before the device had finished the batch it queued
    assert any(done is False for kind, _, done in events if kind == "launch")


def test_the_compiled_packed_layer_is_not_recompiled_for_each_batch_size(net):
    # varlen attention breaks the graph; past the break a value that followed the number of
    # sequences made each batch size a graph of its own, and past 8 the layer ran eager
    from esmshard.compute import compiled

    embedder = Embedder(net, net.alphabet, [12], CUDA, PRECISIONS["bf16"], packed=True,
                        kinds=["mean"])  # fmt: skip
    key = compiled.CacheKey.of(CUDA, "ESM-2", embedder.net, "bf16", "packed")
    layer = compiled.Compiled(embedder.net, key, None)
    layer.start()
    try:
        sequences = [s[:100] for s in SEQUENCES if len(s) >= 100]  # one `longest`: 128
        graphs = []
        for count in range(2, 14):
            embedder.forward(sequences[:count])
            graphs.append(layer.graphs)
    finally:
        layer.finish()
    # the parts after the break: compiled for the first size, then once for any size
    assert graphs[1:] == [graphs[1]] * len(graphs[1:]), graphs
