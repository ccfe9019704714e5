import copy

import numpy as np
import pytest
import torch
from helpers import PROTEINS, TINY_MODEL, read_records, seeded_esmc

from esmshard import models
from esmshard.compute import embedder as embedder_module
from esmshard.compute.batching import make_batches
from esmshard.compute.embedder import Embedder
from esmshard.compute.precision import PRECISIONS

SEQUENCES = [seq[:1022] for _, seq in read_records(PROTEINS)]


@pytest.fixture(scope="module")
def embedder():
    net, alphabet = models.load(models.parse_spec(f"random:{TINY_MODEL}"))
    torch.set_num_threads(2)
    return Embedder(net, alphabet, [6], torch.device("cpu"), PRECISIONS["fp32"])


def test_tokens_are_fair_esm_batch_converter_tokens(embedder):
    from esm.data import BatchConverter

    # mixed lengths with padding, every residue letter of the alphabet, a 1-residue sequence
    batch = SEQUENCES[:6] + ["LAGVSERTIDPKQNFYMHWCXBUZO", "M"]
    _, _, want = BatchConverter(embedder.alphabet)([(str(i), s) for i, s in enumerate(batch)])
    assert torch.equal(embedder.tokens(batch), want)
    with pytest.raises(ValueError, match="not the model.s residue tokens"):
        embedder.tokens(["MKJ"])


def collect(embedder, indices, sequences):
    failed, out = [], {}
    for done, reps in embedder.embed(indices, sequences, failed):
        for i, rep in zip(done, reps):
            out[i] = (rep[6].mean, rep[6].per_tok)
    return out, failed


def test_only_the_kinds_asked_for_leave_the_device(embedder, monkeypatch):
    """With include: [mean], what is read back per batch is layers × sequences × D (and a flag
    per sequence): no tensor with a row per token, and one read-back per kind."""
    net, alphabet = embedder.model, embedder.alphabet
    means_only = Embedder(
        net, alphabet, [3, 6], torch.device("cpu"), PRECISIONS["fp32"], kinds=["mean"]
    )
    every_kind = Embedder(net, alphabet, [3, 6], torch.device("cpu"), PRECISIONS["fp32"])
    batches = make_batches([len(s) for s in SEQUENCES], 4096)
    read_back = []
    launch = Embedder.launch

    def recording(self, sequences, kinds=None, indices=None):
        launched = launch(self, sequences, kinds, indices)
        if self is means_only:
            read_back.append(
                (len(sequences), {k: tuple(v.shape) for k, v in launched.values.items()})
            )
        return launched

    monkeypatch.setattr(Embedder, "launch", recording)
    jobs = [(b, [SEQUENCES[i] for i in b]) for b in batches]
    got = [
        r for parts in means_only.embed_batches(iter(jobs), []) for _, reps in parts for r in reps
    ]
    want = [
        r for parts in every_kind.embed_batches(iter(jobs), []) for _, reps in parts for r in reps
    ]
    assert len(read_back) == len(batches)
    for n, shapes in read_back:
        assert shapes == {"mean": (2, n, 320), "finite": (n,)}
    for rep, full in zip(got, want):
        for layer in (3, 6):
            assert rep[layer].per_tok is None and rep[layer].bos is None
            assert rep[layer].length == len(full[layer].per_tok)
            # the device's fp32 mean is the mean of the rows every_kind reads back (summed in
            # another order: within fp32 rounding of a sum of up to 1022 values)
            np.testing.assert_allclose(rep[layer].mean, full[layer].per_tok.mean(0), atol=1e-5)
            np.testing.assert_array_equal(rep[layer].mean, full[layer].mean)


def test_a_non_finite_value_fails_only_its_sequence(embedder, monkeypatch):
    sequences = SEQUENCES[:4]
    reduce = embedder_module.reduce

    def poisoned(reps, residue, kinds, bos):
        reps[-1][2, 5, 0] = float("nan")  # sequence 2, its fifth residue, at the last layer
        return reduce(reps, residue, kinds, bos)

    monkeypatch.setattr(embedder_module, "reduce", poisoned)
    failed = []
    ((done, reps),) = embedder.embed([10, 11, 12, 13], sequences, failed)
    assert done == [10, 11, 13] and failed == [(12, "non-finite values in the representations")]


def test_injected_out_of_memory_halves_batches_with_identical_results(
    embedder, monkeypatch, caplog
):
    """The halves that ran give exactly what the same batches give when they are planned so.

    Against the whole batch, a sequence's numbers can differ in the last bits, and only where
    its padding differs: with another padded length, the fused attention kernel reduces over
    blocks of keys laid out differently (the masked keys add exact zeros, but the order of the
    partial sums changes). Sequences as long as the longest, padded alike in both, are equal.
    """
    batch = list(range(8))
    sequences = [SEQUENCES[i] for i in batch]
    whole, failed = collect(embedder, batch, sequences)
    assert not failed
    longest = max(len(s) for s in sequences)
    ran = []  # the batches that ran: halves keep the input's order
    launch = Embedder.launch

    def recording(self, batch_sequences, kinds=None, indices=None):
        launched = launch(self, batch_sequences, kinds, indices)
        start = sum(map(len, ran))
        ran.append(list(range(start, start + len(batch_sequences))))
        assert batch_sequences == sequences[start : ran[-1][-1] + 1]
        return launched

    monkeypatch.setattr(Embedder, "launch", recording)
    monkeypatch.setattr(embedder, "inject_oom_tokens", 2 * (longest + 2))
    halved, failed = collect(embedder, batch, sequences)
    assert not failed and sorted(halved) == batch
    assert "retrying as two halves" in caplog.text
    assert [i for half in ran for i in half] == batch and max(map(len, ran)) <= 2
    monkeypatch.setattr(embedder, "inject_oom_tokens", None)
    monkeypatch.setattr(Embedder, "launch", launch)
    for half in ran:
        alone, _ = collect(embedder, half, [sequences[i] for i in half])
        for i in half:
            np.testing.assert_array_equal(halved[i][0], alone[i][0])
            np.testing.assert_array_equal(halved[i][1], alone[i][1])
    for i in batch:
        if len(sequences[i]) == longest:
            np.testing.assert_array_equal(halved[i][0], whole[i][0])
        np.testing.assert_allclose(halved[i][0], whole[i][0], atol=1e-5)
        assert halved[i][1].shape == (len(sequences[i]), 320)


def test_pipelined_batches_give_what_batch_by_batch_gives(embedder, monkeypatch):
    # Out-of-memory halving and a sequence that fails alone, in the middle of the stream.
    lengths = [len(s) for s in SEQUENCES[:16]]
    batches = [(b, [SEQUENCES[i] for i in b]) for b in make_batches(lengths, 2048)]
    monkeypatch.setattr(
        embedder, "inject_oom_tokens", max(lengths) + 1
    )  # the longest fail even alone
    failed_one_by_one, failed_pipelined = [], []
    one_by_one = [embedder.embed(indices, seqs, failed_one_by_one) for indices, seqs in batches]
    pipelined = list(embedder.embed_batches(iter(batches), failed_pipelined))
    assert failed_pipelined == failed_one_by_one
    assert {f.index for f in failed_one_by_one} == {
        i for i, n in enumerate(lengths) if n == max(lengths)
    }
    assert [[done for done, _ in parts] for parts in pipelined] == [
        [done for done, _ in parts] for parts in one_by_one
    ]
    for parts, want_parts in zip(pipelined, one_by_one):
        for (_, reps), (_, want) in zip(parts, want_parts):
            for rep, rep_want in zip(reps, want):
                np.testing.assert_array_equal(rep[6].per_tok, rep_want[6].per_tok)


def test_sequence_that_cannot_fit_alone_is_listed_as_failed(embedder, monkeypatch):
    batch = [i for i, s in enumerate(SEQUENCES) if len(s) < 1000][:3]
    sequences = [SEQUENCES[i] for i in batch]
    too_long = max(batch, key=lambda i: len(SEQUENCES[i]))
    fits_alone = sorted(len(s) for s in sequences)[-2] + 2  # tokens of the second longest
    assert len(SEQUENCES[too_long]) + 2 > fits_alone
    monkeypatch.setattr(embedder, "inject_oom_tokens", fits_alone)
    out, failed = collect(embedder, batch, sequences)
    assert sorted(out) == sorted(set(batch) - {too_long})
    assert len(failed) == 1 and failed[0].index == too_long
    assert "out of memory even alone" in failed[0].reason


def test_chunked_sequence_is_stitched_from_its_windows(embedder):
    sequence = "".join(SEQUENCES)[:2500]
    failed = []
    rep = embedder.embed_chunked(7, sequence, 1022, failed)
    assert not failed and rep[6].per_tok.shape == (2500, 320)
    # the first window's part equals that window embedded alone
    ((_, (alone,)),) = embedder.embed([0], [sequence[:1022]], [])
    np.testing.assert_allclose(rep[6].per_tok[:500], alone[6].per_tok[:500], atol=1e-5)
    np.testing.assert_allclose(rep[6].bos, alone[6].bos, atol=1e-5)


def test_on_a_gpu_under_autocast_dense_weights_take_its_dtype_and_the_rest_fp32():
    """esmshard.compute.placement.placed, on a device that is not the CPU (torch's meta device
    stands in for a GPU): the dense layers' weights in bf16, embeddings and norms in fp32, a
    weight two modules share (ESM-2's embedding and its language-model head) still one."""
    from esmshard.compute.placement import placed
    from esmshard.models.esm2 import random_model

    model = random_model(TINY_MODEL)
    assert model.lm_head.weight is model.embed_tokens.weight
    placed(model, torch.device("meta"), PRECISIONS["bf16"])
    layer = model.layers[0]
    assert layer.fc1.weight.dtype == layer.self_attn.q_proj.bias.dtype == torch.bfloat16
    assert layer.fc1.weight.is_meta
    assert model.embed_tokens.weight.dtype == layer.final_layer_norm.weight.dtype == torch.float32
    assert model.lm_head.weight is model.embed_tokens.weight


@pytest.mark.parametrize("family", ["esm2", "esmc"])
def test_dense_weights_in_autocasts_dtype_give_autocasts_numbers_exactly(family):
    """What `placed` does on a GPU changes no number: autocast casts each product's fp32 weights
    to its dtype, the same values as weights kept in it (shown here with the CPU's autocast)."""
    from esmshard.models.archs import ESMC as ESMC_ARCHS
    from esmshard.models.esm2 import FastESM2
    from esmshard.models.esm2 import random_model as esm2_model
    from esmshard.models.esmc import ALPHABET

    if family == "esm2":
        nets = [FastESM2(esm2_model(TINY_MODEL).eval()) for _ in range(2)]
        alphabet = nets[0].model.alphabet
    else:  # esmc_300m's width and heads; the two layers compared are all that run
        net = seeded_esmc(ESMC_ARCHS["esmc_300m"]._replace(layers=2))
        nets, alphabet = [net, copy.deepcopy(net)], ALPHABET
    for module in nets[1].modules():
        if isinstance(module, torch.nn.Linear):
            module.to(torch.bfloat16)
    sequences = [s for _, s in read_records(PROTEINS) if len(s) < 300][:3]
    tokens = Embedder(nets[0], alphabet, [1], torch.device("cpu"), PRECISIONS["fp32"]).tokens(
        sequences
    )
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
        fp32, bf16 = (net(tokens, [1, 2])["representations"] for net in nets)
    for layer in (1, 2):
        assert torch.equal(fp32[layer], bf16[layer])
