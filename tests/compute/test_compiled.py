"""Compiled layers (esmshard.compute.compiled): the eager path's numbers from one graph for every
layer and batch, a cache entry checked before it is used, and runs that share a store's cache."""

import json
import logging

import h5py
import numpy as np
import pytest
import torch
from helpers import (
    PROTEINS,
    config,
    read_records,
    seeded_esm2,
    seeded_esmc,
    snakemake,
    write_subset,
)

from esmshard.compute import compiled
from esmshard.compute.batching import make_batches
from esmshard.compute.embedder import Embedder
from esmshard.compute.precision import PRECISIONS
from esmshard.input import sizing
from esmshard.models.archs import Arch
from esmshard.models.esm1 import build
from esmshard.models.esmc import ALPHABET

SEQUENCES = [seq[:1022] for _, seq in read_records(PROTEINS)]
CPU = torch.device("cpu")


def esm2():
    """A small ESM-2 (3 layers, D = 64, rotary positions) with seeded random weights: the graph
    the compiler builds is the same code at any width, and esm2_t6's compute tripled the test."""
    model = seeded_esm2(3, 64)
    return model, model.alphabet, 3


def esmc():
    """A small ESM C (3 layers, D = 64) with seeded random weights."""
    return seeded_esmc(Arch(3, 64, 4)), ALPHABET, 3


def esm1():
    """A small ESM-1b layout (3 layers, D = 64): ESM-2's layers, learned positions."""
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = build(Arch(3, 64, 4)).eval()
    return model, model.alphabet, 3


@pytest.mark.parametrize(
    "setting, device, eager, expected",
    [
        ("auto", "cuda", 600.0, True),
        ("auto", "cuda", 9.2, False),  # shorter than a first compile
        ("auto", "cpu", 600.0, False),
        ("on", "cpu", 0.1, True),
        (True, "cuda", 0.1, True),  # a YAML file's bare `on`
        ("off", "cuda", 600.0, False),
        (False, "cuda", 600.0, False),
    ],
)
def test_auto_compiles_on_cuda_devices_where_it_repays_and_on_off_mean_what_they_say(
    setting, device, eager, expected
):
    assert compiled.wanted(setting, torch.device(device), eager) is expected


def test_a_proteome_of_a_million_tokens_runs_eagerly_and_a_cluster_shard_compiled():
    # E. coli's proteome through esm2_t33 on an H200 (docs/benchmarks.md): the eager job
    # computed it in 9.0-9.4 s; compiling cost 18.5 s (3.9 s + 7.1 s from the store's entry).
    t33 = 12 * 33 * 1280**2
    proteome = compiled.eager_seconds(1_346_422, t33)
    assert 8.5 < proteome < 10
    assert not compiled.repays(proteome) and not compiled.repays(proteome, cached=True)
    # a shard as `shards: auto` sizes them where there is more work: 800 s of a fast GPU's
    fast_tokens_per_s = sizing.FAST_GPU_FLOPS / (2 * t33)
    shard = sizing.JOB_OVERHEAD_SECONDS / sizing.TARGET_OVERHEAD_FRACTION * fast_tokens_per_s
    assert compiled.repays(compiled.eager_seconds(shard, t33))
    # the break-even: the share of the eager time that compiling saves, against its cost
    for cached in (False, True):
        least = compiled.compile_seconds(cached) / (1 - 1 / compiled.COMPILED_SPEEDUP)
        assert not compiled.repays(least * 0.99, cached) and compiled.repays(least * 1.01, cached)
    # the store's compiled code lowers it: a shard between the two compiles only with it
    between = compiled.CACHED_COMPILE_SECONDS / (1 - 1 / compiled.COMPILED_SPEEDUP) * 1.2
    assert compiled.repays(between, cached=True) and not compiled.repays(between)
    cuda = torch.device("cuda")
    assert compiled.wanted("auto", cuda, between, lambda: True)
    assert not compiled.wanted("auto", cuda, between, lambda: False)


def test_whether_the_store_holds_a_devices_compiled_code_is_asked_only_where_it_matters():
    asked = []

    def cached():
        asked.append(True)
        return True

    assert not compiled.wanted("auto", torch.device("cpu"), 600.0, cached)
    assert compiled.wanted("on", torch.device("cpu"), 0.1, cached)
    assert not compiled.wanted("off", torch.device("cuda"), 600.0, cached)
    assert not asked
    assert compiled.wanted("auto", torch.device("cuda"), 600.0, cached) and asked


def key(net, batching="packed", **changes) -> compiled.CacheKey:
    return compiled.CacheKey.of(CPU, "ESM-2", net, "fp32", batching)._replace(**changes)


@pytest.mark.parametrize(
    "family, batching",
    [(esm2, "packed"), (esm2, "padded"), (esmc, "packed"), (esmc, "padded"), (esm1, "packed")],
    ids=["esm2-packed", "esm2-padded", "esmc-packed", "esmc-padded", "esm1-packed"],
)
def test_one_compiled_graph_gives_the_eager_numbers_for_every_layer_and_batch(family, batching):
    torch.set_num_threads(2)
    model, alphabet, layers = family()
    embedders = [
        Embedder(
            model, alphabet, [0, layers], CPU, PRECISIONS["fp32"], packed=batching == "packed"
        )
        for _ in range(2)
    ]
    eager, fast = embedders
    layer = compiled.Compiled(fast.net, key(fast.net, batching), None)
    layer.start()
    try:
        lengths = [len(s) for s in SEQUENCES]
        planned = make_batches(lengths, 4096, batching == "packed")
        # the longest proteins (a 1022-residue one), middling and short ones, a lone sequence
        batches = planned[:2] + planned[len(planned) // 2 : len(planned) // 2 + 1] + planned[-1:]
        batches.append([planned[-1][0]])
        assert any(lengths[b[0]] == 1022 for b in batches)
        for batch in batches:
            seqs = [SEQUENCES[i] for i in batch]
            for got, want in zip(fast.forward(seqs), eager.forward(seqs)):
                for n in (0, layers):
                    assert np.abs(got[n].mean - want[n].mean).max() <= 1e-4
                    assert np.abs(got[n].bos - want[n].bos).max() <= 1e-4
        # Every layer of every batch ran compiled code: one graph, and for padded batches one
        # more for the lone sequence (a batch of size 1 is a shape of its own).
        assert layer.graphs == (1 if batching == "packed" else 2)
        assert layer.seconds > 0
    finally:
        layer.finish()
    assert fast.net.compiled_block is None


def test_a_packed_layer_whose_graph_breaks_at_attention_is_not_recompiled_per_batch_size(
    monkeypatch,
):
    # On CUDA, torch's varlen attention breaks the compiled graph. Past the break the compiler
    # guards on every value the layer was given: a value that followed the number of sequences
    # made each batch size a graph of its own, and past 8 the layer ran eager (an H200 found it).
    from esmshard.models import esm2 as esm2_module

    def breaking(*args, **kwargs):
        torch._dynamo.graph_break()
        return packed_attention(*args, **kwargs)

    packed_attention = esm2_module.packed_attention
    monkeypatch.setattr(esm2_module, "packed_attention", breaking)
    torch.set_num_threads(2)
    model, alphabet, layers = esm2()
    fast = Embedder(
        model, alphabet, [layers], CPU, PRECISIONS["fp32"], packed=True, kinds=["mean"]
    )
    layer = compiled.Compiled(fast.net, key(fast.net), None)
    layer.start()
    try:
        sequences = [s[:100] for s in SEQUENCES if len(s) >= 100]  # one `longest`: 128
        # the parts after the break are compiled for the first size, then once for any size
        fast.forward(sequences[:2])
        fast.forward(sequences[:3])
        graphs = layer.graphs
        for count in range(4, 14):  # ten more batch sizes
            fast.forward(sequences[:count])
        assert layer.graphs == graphs
    finally:
        layer.finish()


def test_an_entry_reads_back_only_as_written_and_for_its_own_key(tmp_path):
    folder = tmp_path / "compiler"
    (folder / "fxgraph").mkdir(parents=True)
    (folder / "fxgraph" / "graph").write_bytes(b"compiled" * 1000)
    (folder / "locks").mkdir()
    net, _, _ = esm2()
    mine = key(net)
    entry = compiled.Entry.at(tmp_path / "cache", mine)
    assert entry.read(mine) == (None, None)  # none yet: no problem either
    assert not entry.usable(mine)
    entry.write(mine, folder)
    archive, problem = entry.read(mine)
    assert archive and problem is None and entry.usable(mine)
    assert entry.path.parent.name == "cache" and not list(entry.path.parent.glob(".*"))

    foreign = mine._replace(torch="1.0.0 abc")
    assert "another torch" in entry.read(foreign)[1] and not entry.usable(foreign)
    assert compiled.Entry.at(tmp_path / "cache", foreign).path != entry.path

    data = entry.path.read_bytes()
    flipped = bytearray(data)
    flipped[-100] ^= 0xFF
    entry.path.write_bytes(bytes(flipped))
    assert "SHA-256" in entry.read(mine)[1] and not entry.usable(mine)
    entry.path.write_bytes(data[:-10])
    assert "bytes where" in entry.read(mine)[1]
    entry.path.write_bytes(b"\x00garbage")
    assert "unreadable" in entry.read(mine)[1]
    entry.path.write_bytes(b"")  # empty
    assert "unreadable" in entry.read(mine)[1]
    entry.path.write_text("[]\n")  # JSON of another shape
    assert "another torch" in entry.read(mine)[1]
    entry.path.unlink()
    entry.path.mkdir()  # a folder in its place
    assert "unreadable" in entry.read(mine)[1]


def test_a_damaged_entry_is_ignored_and_replaced_by_the_jobs_own_compilation(tmp_path, caplog):
    torch.set_num_threads(2)
    model, alphabet, layers = esm2()
    embedder = Embedder(model, alphabet, [layers], CPU, PRECISIONS["fp32"], packed=True)
    cache = tmp_path / "store" / ".compiled"
    mine = key(embedder.net)
    entry = compiled.Entry.at(cache, mine)
    entry.path.parent.mkdir(parents=True)
    entry.path.write_bytes(json.dumps({"key": mine._asdict()}).encode() + b"\nnot an archive")
    torch._dynamo.reset()  # nothing compiled earlier in this process helps
    layer = compiled.Compiled(embedder.net, mine, cache)
    with caplog.at_level(logging.WARNING):
        layer.start()
        embedder.forward(SEQUENCES[:3])
        layer.finish()
    assert not layer.hit and "ignored" in caplog.text and str(entry.path) in caplog.text
    archive, problem = entry.read(mine)
    assert archive and problem is None  # rebuilt from this job's compilation


def means(outdir):
    with h5py.File(outdir / "embeddings.h5") as h5:
        return dict(zip(h5["ids"].asstr()[:], h5["mean/6"][:]))


def embed_metrics(outdir) -> dict:
    (path,) = (outdir / "metrics").glob("*.json")
    return json.loads(path.read_text())


def test_runs_sharing_a_store_compile_once_and_give_the_eager_numbers(tmp_path):
    """Two runs on two inputs share one store: the second's embed job loads what the first
    compiled (a damaged entry, compiled again, is test_a_damaged_entry_is_ignored_...)."""
    inputs = [
        write_subset(f"ecoli_compile_{k}.fasta", lambda i, h, s, k=k: i % 150 == 7 * k + 1)
        for k in range(2)
    ]
    store = tmp_path / "store"
    # the eager path's numbers for both inputs, in one run
    eager = tmp_path / "eager"
    both = f"input=[{inputs[0]},{inputs[1]}]"
    snakemake(tmp_path, {}, *config(inputs[0], eager, both, "compile=off", "shards=1"))
    assert embed_metrics(eager)["compile_cache"] == "off"
    want = means(eager)
    runs, probes = [], []
    for k, path in enumerate(inputs):
        outdir = tmp_path / f"compiled_{k}"
        snakemake(tmp_path, {}, *config(path, outdir, f"store={store}", "compile=on", "shards=1"))
        runs.append(embed_metrics(outdir))
        # the compiler's probe of this CPU's vector instructions: built once for the machine
        # under this suite's user cache, then loaded, not built again, by the next job
        probes.append({p: p.stat().st_mtime_ns for p in
                       compiled.vector_probe_folder().rglob("*.so")})  # fmt: skip
        got = means(outdir)
        assert len(got) > 10 and got.keys() <= want.keys()
        assert max(np.abs(got[i] - want[i]).max() for i in got) <= 1e-4
    first, second = runs
    assert probes[0] and probes[1] == probes[0]
    assert (first["compile_cache"], second["compile_cache"]) == ("miss", "hit")
    # the second loaded every graph the first compiled: counted, not timed
    assert first["compiled_anew"] >= 1 and second["compiled_anew"] == 0, runs
    (entry,) = (store / ".compiled").glob("*.entry")
    report = json.loads((tmp_path / "compiled_1" / "report" / "scaling.json").read_text())
    assert report["compile_cache_hits"] == 1
    with open(entry, "rb") as fh:
        header = json.loads(fh.readline())
    assert header["key"]["device"] == compiled.device_kind(CPU)
    assert (entry.parent.parent / ".esmshard-store.json").is_file()
