"""Every tool a user would pick beside esmshard: the same proteins, batches and device, one run.

    python benchmarks/peers.py --device cuda --every 1 --toks-per-batch 65536
    python benchmarks/peers.py --esm2 esm2_t6_8M_UR50D --esmc esmc_300m --esmc-sequences 4 \
        --esmc-layers 2 --big --every 100 --toks-per-batch 4096 --threads 2

ESM-2 (`--esm2`, random weights of the real shape): fair-esm's model in fp32 and with its weights
in bf16 (as `model.bfloat16()` gives it); transformers' `EsmModel` in bf16 with SDPA attention
(what HuggingFace users run); esmshard's forward pass in `--precision` with padded batches, with
packed ones, and packed through the compiled layer (`compile: on`, compiled before the timed
repetitions: its seconds are reported apart). The padded sides all take esmshard's padded
batches for `--toks-per-batch` tokens; the packed sides its packed batches for the same budget.
ESM C (`--esmc`): transformers' `EsmcModel` in bf16 on the padded batches, beside esmshard
packed and packed compiled. `--fp8` (default: where the device computes it, Hopper GPUs and
CPUs) adds esmshard packed and packed compiled in fp8 for each ESM-2 and ESM C model, their rows
carrying FP8's error against esmshard's fp32 on the same proteins and weights: the per-residue
cosine at the 1st percentile and the least protein's mean cosine (`cosine_p1_vs_fp32`,
`cosine_min_per_protein_vs_fp32`). `--big` (default on a GPU) adds the largest models
(`--big-models`: esm2_t36_3B, esm2_t48_15B and ESM C 6B, random weights made on the device, on
every `--big-every`-th protein), esmshard packed and compiled in `--precision` and in fp8 where
`--fp8`: tokens/s, peak memory and the seconds of building and compiling. Every side reads the
mean over each sequence's residues back to the host; sides alternate, `--repeats` times.

Prints one JSON line per side: tokens/s (BOS and EOS counted, padding not), the share of the
device's measured matrix-product peak in the side's precision, and the speed-up over the
family's baseline (fair-esm fp32 for ESM-2, transformers for ESM C). A peer whose package is
missing (transformers) is one JSON line saying so, and the other sides still run. `--profile FILE`
writes where the first ESM-2 model's esmshard packed sides spend their time (torch's profiler,
one run each: the busiest operations and the device's busy share of the wall time).
"""

import argparse
import copy
import importlib.util
import json
import re
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from throughput import DEFAULT_FASTA, esmc_models, flops, matmul_peaks, subset, synchronize

from esmshard.compute import compiled
from esmshard.compute.batching import make_batches
from esmshard.compute.embedder import Embedder
from esmshard.compute.precision import FP8_CAPABILITY, PRECISIONS
from esmshard.input.fasta import read_fasta
from esmshard.models import ESM2, ESMC, load, parse_spec
from esmshard.models.esm2 import random_model
from esmshard.models.esmc import ALPHABET as ESMC_ALPHABET
from esmshard.models.esmc import ESMC as ESMCModule
from esmshard.models.esmc import Shape, ffn_size
from esmshard.models.weights import on_meta

# The largest published shapes (`--big`): the ones no peer publishes an inference figure for.
BIG = ("esm2_t36_3B_UR50D", "esm2_t48_15B_UR50D", "esmc_6b")
# FP8's recipes (`--fp8-recipes`): the products each computes in FP8, the rest as bf16 computes
# them. `fp8` is `precision: fp8`'s; `fp8-feed-forward` keeps the attention's in bf16, the
# products that carry FP8's error (benchmarks/fp8_layers.py).
FP8_RECIPES = {"fp8": "dense_products", "fp8-feed-forward": "feed_forward_products"}
# The seed of the largest models' random weights: their fp32 reference and each precision's
# model are built with the same values
BIG_SEED = 0


def masked_means(hidden, toks, lengths):
    """Each sequence's mean over its residues (BOS at 0), one copy to the host per batch."""
    positions = torch.arange(toks.shape[1], device=toks.device)
    residue = (positions >= 1) & (positions <= lengths[:, None])
    sums = hidden.float().masked_fill(~residue[..., None], 0).sum(1)
    return (sums / lengths[:, None]).cpu()


def padded_side(forward, tokens_of, sequences, batches, device):
    """A peer's model (`forward`: tokens -> B × L × D) on esmshard's padded batches."""

    def run():
        with torch.inference_mode():
            for batch in batches:
                seqs = [sequences[i] for i in batch]
                toks = tokens_of.tokens(seqs).to(device, non_blocking=True)
                lengths = torch.tensor([len(s) for s in seqs], device=device)
                masked_means(forward(toks), toks, lengths)

    return run


def esmshard_side(embedder, sequences, batches):
    """esmshard's Embedder as the embed step runs it (look-ahead, read-back of the means)."""

    def run():
        work = ((b, [sequences[i] for i in b]) for b in batches)
        for parts in embedder.embed_batches(work, failed=[]):
            for _, reps in parts:
                for rep in reps:
                    next(iter(rep.values())).mean

    return run


def compiled_run(side, embedder, family, precision: str):
    """`side` (a run of `embedder`) through the compiled layer, compiled first on every shape
    that `side` runs: the run, and the compiled layer (its seconds of compiling, its graphs).

    The layer is attached to the forward pass only while this side runs: a model that is its own
    forward pass (ESM C), or an embedder that eager sides share, must stay eager for them."""
    net = embedder.net
    key = compiled.CacheKey.of(embedder.device, family, net, precision, embedder.batching)
    layer = compiled.Compiled(net, key, None)  # no cache: this process compiles it all
    layer.start()
    side()
    net.compiled_block = None

    def run():
        net.compiled_block = layer
        try:
            return side()
        finally:
            net.compiled_block = None

    return run, layer


def compiled_side(embedder, sequences, batches, family, precision):
    """`esmshard_side` through the compiled layer (`compiled_run`)."""
    return compiled_run(esmshard_side(embedder, sequences, batches), embedder, family, precision)


def device_name(device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def timed(run, device) -> float:
    synchronize(device)
    started = time.perf_counter()
    run()
    synchronize(device)
    return time.perf_counter() - started


def skipped(side: str, package: str) -> bool:
    """Whether `package` is missing; if so, one JSON line says which side is skipped and why."""
    if importlib.util.find_spec(package) is not None:
        return False
    why = f"{package} is not installed (pip install 'esmshard[gpu-check]')"
    print(json.dumps({"skipped": side, "why": why}), flush=True)
    return True


def huggingface_esm2(name, device):
    """transformers' EsmModel of ESM-2's shape `name` (random weights), bf16, SDPA attention."""
    import transformers

    layers, dim, heads = ESM2.archs[name]
    return transformers.EsmModel(
        transformers.EsmConfig(
            vocab_size=33, hidden_size=dim, num_hidden_layers=layers, num_attention_heads=heads,
            intermediate_size=4 * dim, position_embedding_type="rotary", token_dropout=True,
            pad_token_id=1, mask_token_id=32, emb_layer_norm_before=False,
            max_position_embeddings=1026, attn_implementation="sdpa",
        ),
        add_pooling_layer=False,
    ).eval().to(device, torch.bfloat16)  # fmt: skip


def esm2_sides(name, sequences, args, device):
    """(side, precision, run) for ESM-2's peers and esmshard, and the compiled layer."""
    net = random_model(name).eval().to(device)
    layers = net.num_layers
    # fair-esm's own sides get models of their own: an Embedder in bf16 on a GPU keeps `net`'s
    # dense weights in bf16 (esmshard.compute.embedder.placed)
    fp32 = random_model(name).eval().to(device)
    bf16 = random_model(name).eval().to(device, torch.bfloat16)
    precision = PRECISIONS[args.precision]
    padded_fast, packed_fast, packed_compiled = (
        Embedder(net, net.alphabet, [layers], device, precision, kinds=["mean"], packed=packed)
        for packed in (False, True, True)
    )
    lengths = [len(s) for s in sequences]
    padded, packed = (make_batches(lengths, args.toks_per_batch, p) for p in (False, True))

    def fair_esm(model):
        return lambda toks: model(toks, repr_layers=[layers])["representations"][layers]

    run_compiled, layer = compiled_side(
        packed_compiled, sequences, packed, "ESM-2", args.precision
    )
    sides = [
        ("fair-esm", "fp32", padded_side(fair_esm(fp32), padded_fast, sequences, padded, device)),
        ("fair-esm", "bf16", padded_side(fair_esm(bf16), padded_fast, sequences, padded, device)),
    ]
    if not skipped("transformers EsmModel (SDPA)", "transformers"):
        hf = huggingface_esm2(name, device)
        sides.append((
            "transformers EsmModel (SDPA)",
            "bf16",
            padded_side(
                lambda toks: hf(input_ids=toks, attention_mask=toks.ne(1)).last_hidden_state,
                padded_fast,
                sequences,
                padded,
                device,
            ),
        ))  # fmt: skip
    sides += [
        ("esmshard padded", args.precision, esmshard_side(padded_fast, sequences, padded)),
        ("esmshard packed", args.precision, esmshard_side(packed_fast, sequences, packed)),
        ("esmshard packed compiled", args.precision, run_compiled),
    ]
    compiled_layers = {args.precision: layer}
    if args.fp8:
        fresh = lambda: (copy.deepcopy(fp32), net.alphabet)  # noqa: E731 (on the device already)
        sides += fp8_sides(fresh, layers, sequences, packed, "ESM-2", compiled_layers, args,
                           device)  # fmt: skip
    return sides, compiled_layers


def fp8_embedder(model, alphabet, layer, device, recipe, kinds=("mean",)):
    """An Embedder of `model` at `layer`, packed, with `recipe`'s products in FP8 (FP8_RECIPES)
    and the rest as bf16 computes them (for `fp8`, what `precision: fp8` gives)."""
    embedder = Embedder(model, alphabet, [layer], device, PRECISIONS["bf16"], kinds=list(kinds),
                        packed=True)  # fmt: skip
    embedder.net.use_fp8(getattr(embedder.net, FP8_RECIPES[recipe])())
    return embedder


def fp8_sides(fresh, layer, sequences, batches, family, compiled_layers, args, device) -> list:
    """esmshard packed and packed compiled in each of `args.fp8_recipes` at `layer`, each on a
    fresh fp32 model (`fresh()`: (model, alphabet), as esmshard.models.load gives them); the
    compiled layers into `compiled_layers`."""
    sides = []
    for recipe in args.fp8_recipes:
        packed, compiled = (fp8_embedder(*fresh(), layer, device, recipe) for _ in range(2))
        run, compiled_layers[recipe] = compiled_side(compiled, sequences, batches, family, recipe)
        sides += [
            ("esmshard packed", recipe, esmshard_side(packed, sequences, batches)),
            ("esmshard packed compiled", recipe, run),
        ]
    return sides


def fp8_errors(fresh, layer, sequences, args, device) -> dict[str, dict[str, float]]:
    """Each FP8 recipe's error against fp32 at `layer` (`error_against`), esmshard's forward
    pass on the same weights (`fresh()`: a new fp32 model and its alphabet each call) and
    proteins (packed, as the run computes)."""
    want = embedded(Embedder(*fresh(), [layer], device, PRECISIONS["fp32"],
                             kinds=["mean", "per_tok"], packed=True), layer, sequences, args)  # fmt: skip
    return {
        recipe: error_against(want, embedded(
            fp8_embedder(*fresh(), layer, device, recipe, ("mean", "per_tok")),
            layer, sequences, args))
        for recipe in args.fp8_recipes
    }  # fmt: skip


def embedded(embedder, layer, sequences, args, kinds=None) -> list:
    """Each protein's representation at `layer` (packed batches of `args.toks_per_batch`), of
    `kinds` (default: the Embedder's)."""
    batches = make_batches([len(s) for s in sequences], args.toks_per_batch, True)
    found = {}
    with torch.inference_mode():
        for batch in batches:
            for done, reps in embedder.embed(batch, [sequences[i] for i in batch], [], kinds):
                found.update((i, rep[layer]) for i, rep in zip(done, reps))
    return [found[i] for i in range(len(sequences))]


def error_against(want, got) -> dict[str, float]:
    """`got`'s representations against `want`'s: the per-residue cosine at the 1st percentile,
    and the least protein's cosine of its means."""

    def cosines(a, b):  # row by row
        return (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)

    residues = cosines(np.concatenate([g.per_tok for g in got]),
                       np.concatenate([w.per_tok for w in want]))  # fmt: skip
    means = cosines(np.stack([g.mean for g in got]), np.stack([w.mean for w in want]))
    return {
        "cosine_p1_vs_fp32": float(np.percentile(residues, 1)),
        "cosine_min_per_protein_vs_fp32": float(means.min()),
    }


def esmc_sides(name, sequences, args, device, folder):
    hf, net, alphabet = esmc_models(name, folder, device, args.esmc_layers)
    hf.to(torch.bfloat16)
    layers = net.num_layers
    precision = PRECISIONS[args.precision]
    padded_fast, packed_fast, packed_compiled = (
        Embedder(net, alphabet, [layers], device, precision, kinds=["mean"], packed=packed)
        for packed in (False, True, True)
    )
    lengths = [len(s) for s in sequences]
    padded, packed = (make_batches(lengths, args.toks_per_batch, p) for p in (False, True))
    run_compiled, layer = compiled_side(
        packed_compiled, sequences, packed, "ESM C", args.precision
    )
    sides = [
        (
            "transformers EsmcModel (SDPA)",
            "bf16",
            padded_side(
                lambda toks: hf(input_ids=toks, attention_mask=toks.ne(1)).last_hidden_state,
                padded_fast,
                sequences,
                padded,
                device,
            ),
        ),  # fmt: skip
        ("esmshard packed", args.precision, esmshard_side(packed_fast, sequences, packed)),
        ("esmshard packed compiled", args.precision, run_compiled),
    ]
    compiled_layers = {args.precision: layer}
    if args.fp8:
        fresh = fresh_esmc(folder)
        sides += fp8_sides(fresh, layers, sequences, packed, "ESM C", compiled_layers, args,
                           device)  # fmt: skip
    return sides, compiled_layers


def fresh_esm2(name: str):
    """A maker of (ESM-2 `name` with its seeded random weights in fp32, alphabet): copies of one
    model (making the random weights again would take the CPU seconds for a 650M model)."""
    net = random_model(name).eval()
    return lambda: (copy.deepcopy(net), net.alphabet)


def fresh_esmc(folder: Path):
    """A maker of (ESM C model in fp32, alphabet), each read anew from the folder that
    `esmc_models` saved (the Embedder puts it on its device)."""
    return lambda: load(parse_spec(str(folder)))


def measure(name, arch, sides, layers_of, sequences, args, device, errors=None) -> None:
    """Time the sides, alternating, and print a line for each; `layers_of`: the compiled layer
    of each precision, `errors`: what rows of a precision carry beside their times (FP8's
    error)."""
    layers, dim, _ = arch
    precisions = {p for _, p, _ in sides}

    def peaks_now() -> dict[str, float]:
        # an FP8 recipe's share is of FP8's peak, the attention's products in bf16 or not
        return {
            p: max(matmul_peaks(dim, "fp8" if p in FP8_RECIPES else p, device).values())
            for p in precisions
        }

    # The peak before the sides and after them, the better kept: on a machine that something
    # else slows meanwhile (a CPU shared with other work), one reading can fall below what a
    # side then reaches.
    before = peaks_now()
    times = {(side, precision): [] for side, precision, _ in sides}
    for _ in range(args.repeats):
        for side, precision, run in sides:
            times[side, precision].append(timed(run, device))
    for layer in layers_of.values():
        layer.finish()
    tokens = sum(len(s) + 2 for s in sequences)
    work = flops([len(s) + 2 for s in sequences], layers, dim)
    peaks = {p: max(before[p], after) for p, after in peaks_now().items()}
    baseline = statistics.median(times[sides[0][0], sides[0][1]])
    for side, precision, _ in sides:
        seconds = statistics.median(times[side, precision])
        row = {
            "model": name,
            "layers": layers,
            "side": side,
            "precision": precision,
            "device": device_name(device),
            "sequences": len(sequences),
            "tokens": tokens,
            "seconds": seconds,
            "runs": times[side, precision],
            "tokens_per_s": tokens / seconds,
            "matmul_peak_tflops": peaks[precision] / 1e12,
            "share_of_peak": work / seconds / peaks[precision],
            "baseline": f"{sides[0][0]} {sides[0][1]}",
            "speedup_vs_baseline": baseline / seconds,
        }
        if "compiled" in side:
            layer = layers_of[precision]
            row.update(compile_seconds=layer.seconds, compiled_graphs=layer.graphs)
        row.update((errors or {}).get(precision, {}))
        print(json.dumps(row), flush=True)


# The classes of a profile's kernels (`by_class`): the first whose pattern a kernel's name
# holds; element-wise work and copies (rotary embeddings, residual additions, casts) are the rest.
KERNEL_CLASSES = {
    "attention": r"flash|fmha|attention|scaled_dot_product",
    # cuBLAS's and CUTLASS's kernels; aten's and oneDNN's products on a CPU
    "products": r"gemm|nvjet|cutlass|xmma|cublas|scaled_mm|addmm|\bb?mm\b|matmul|linear",
    # a compiled layer's one kernel per product (each row's scale and cast); eager, its
    # division and cast are element-wise
    "FP8 quantization": r"amax|float8|fp8",
    "norms": r"layer_norm|layernorm|rms_norm",
    "activation": r"gelu|silu",
}
ELEMENT_WISE = "element-wise and copies"


def kernel_class(name: str) -> str:
    """The class of KERNEL_CLASSES a kernel or operation named `name` is in."""
    found = (c for c, pattern in KERNEL_CLASSES.items() if re.search(pattern, name.lower()))
    return next(found, ELEMENT_WISE)


def by_class(events, cuda: bool) -> dict[str, float]:
    """Seconds of a profile's `events` (torch's key averages) per `kernel_class`: the device's
    kernels, or a CPU's operations (their own time) without one."""
    kind = torch.autograd.DeviceType.CUDA if cuda else torch.autograd.DeviceType.CPU
    seconds = dict.fromkeys([*KERNEL_CLASSES, ELEMENT_WISE], 0.0)
    for event in (e for e in events if e.device_type == kind):
        own = event.self_device_time_total if cuda else event.self_cpu_time_total
        seconds[kernel_class(event.key)] += own / 1e6
    return seconds


def profile(name, sides, device, path: Path) -> None:
    """One run of each esmshard packed side under torch's profiler: its busiest operations
    (self time on the device, or on the CPU without one) into `path`, and a JSON line with the
    wall time, the device's busy time (the sum of its kernels' own times), the rest of the wall
    time (the host's gaps) and the kernels' seconds per class (`by_class`)."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as profiler

    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    sort = "self_device_time_total" if cuda else "self_cpu_time_total"
    tables = []
    for side, precision, run in sides:
        if not side.startswith("esmshard packed"):
            continue
        with profiler(activities=activities) as prof:
            seconds = timed(run, device)
        events = prof.key_averages()
        # the kernels' time, as the operations that launched them count it (the kernels' own
        # rows count it again)
        on_cpu = [e for e in events if e.device_type == torch.autograd.DeviceType.CPU]
        busy = sum(e.self_device_time_total for e in on_cpu) / 1e6 if cuda else None
        print(json.dumps({
            "model": name, "side": side, "precision": precision, "profiled_seconds": seconds,
            "device_busy_seconds": busy, "device_busy_share": busy / seconds if cuda else None,
            "host_gap_seconds": seconds - busy if cuda else None,
            "seconds_by_class": by_class(events, cuda),
        }), flush=True)  # fmt: skip
        table = events.table(sort_by=sort, row_limit=25, max_name_column_width=60)
        tables.append(f"# {name}, {side} ({precision}): {seconds:.3f} s wall\n{table}")
    path.write_text("\n\n".join(tables))


def built_on(device, build):
    """The module `build()` makes, its parameters given random values made on `device` in bf16
    (weights N(0, 0.02), a norm's scale 1, biases 0): built on torch's meta device
    (esmshard.models.weights.on_meta), so the 15B model's fp32 weights never take the host's 60
    GB nor a minute of its random numbers. Buffers (rotary frequencies) are computed on the
    CPU, then moved."""
    with on_meta():
        net = build()
    for module in net.modules():
        for name, param in list(module.named_parameters(recurse=False)):
            values = torch.empty(param.shape, device=device, dtype=torch.bfloat16)
            if param.dim() > 1:
                values.normal_(0, 0.02)
            else:
                values.fill_(1 if name == "weight" else 0)
            setattr(module, name, torch.nn.Parameter(values, requires_grad=False))
    return net.to(device).eval()


def big_model(name: str, device, layers: int | None):
    """(esmshard's model of the published shape `name`, its first `layers` layers (all by
    default), random weights on `device` (`built_on`) drawn from BIG_SEED: the same values at
    each build; its alphabet; its family's title)."""
    torch.manual_seed(BIG_SEED)
    if name in ESMC.archs:
        arch = ESMC.archs[name]
        arch = arch._replace(layers=layers or arch.layers)
        return (
            built_on(device, lambda: ESMCModule(Shape(arch, ffn_size(arch.dim)))),
            ESMC_ALPHABET,
            "ESM C",
        )
    from esm.model.esm2 import ESM2 as FairEsm2

    arch = ESM2.archs[name]
    net = built_on(device, lambda: FairEsm2(num_layers=layers or arch.layers, embed_dim=arch.dim,
                                            attention_heads=arch.heads, alphabet="ESM-1b"))  # fmt: skip
    return net, net.alphabet, "ESM-2"


def big_embedder(name, precision, args, device):
    """(`big_model(name)` in an Embedder of `precision` or FP8 recipe, packed, at its last
    layer; the family's title)."""
    net, alphabet, family = big_model(name, device, args.big_layers)
    if precision in FP8_RECIPES:
        return fp8_embedder(net, alphabet, net.num_layers, device, precision), family
    embedder = Embedder(net, alphabet, [net.num_layers], device, PRECISIONS[precision],
                        kinds=["mean"], packed=True)  # fmt: skip
    return embedder, family


def big(sequences, args, device) -> None:
    """The largest models (`--big-models`), esmshard packed and compiled as `compile: auto`
    runs a cluster's shard, in `--precision` and in each FP8 recipe where `--fp8`: a JSON line
    each with tokens/s, the device's peak memory, the seconds of building the model on the
    device (random weights: not a checkpoint's loading) and of compiling its layer, and its
    error against fp32 on the same weights (`error_against`) over the first
    `--big-error-sequences` proteins. One model at a time on the device: the fp32 one first
    (the 15B's 60 GB), for the reference."""
    batches = make_batches([len(s) for s in sequences], args.toks_per_batch, True)
    tokens = sum(len(s) + 2 for s in sequences)
    checked = sequences[: args.big_error_sequences]
    kinds = ["mean", "per_tok"]
    for name in args.big_models:
        fresh_device(device)
        embedder, _ = big_embedder(name, "fp32", args, device)
        want = embedded(embedder, embedder.net.num_layers, checked, args, kinds)
        del embedder
        for precision in [args.precision] + (args.fp8_recipes if args.fp8 else []):
            fresh_device(device)
            started = time.perf_counter()
            embedder, family = big_embedder(name, precision, args, device)
            built = time.perf_counter() - started
            run, layer = compiled_side(embedder, sequences, batches, family, precision)
            seconds = timed(run, device)
            layer.finish()
            layers = embedder.net.num_layers
            got = embedded(embedder, layers, checked, args, kinds)
            print(json.dumps({
                "model": name, "layers": layers, "side": "esmshard packed compiled",
                "precision": precision, "device": device_name(device),
                "sequences": len(sequences), "tokens": tokens,
                "seconds": seconds, "tokens_per_s": tokens / seconds,
                "peak_memory_bytes": torch.cuda.max_memory_allocated(device)
                if device.type == "cuda" else None,
                "build_seconds": built, "compile_seconds": layer.seconds,
                "compiled_graphs": layer.graphs, "error_sequences": len(checked),
                **error_against(want, got),
            }), flush=True)  # fmt: skip
            del embedder, run, layer
            torch._dynamo.reset()  # its compiled graphs hold the model's weights on the device


def fresh_device(device) -> None:
    """The device's cached memory freed and its peak reset, before the next model."""
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fasta", type=Path, default=DEFAULT_FASTA)
    parser.add_argument("--every", type=int, default=1, help="every N-th record (1: all)")
    parser.add_argument("--esm2", nargs="*", default=["esm2_t33_650M_UR50D"])
    parser.add_argument("--esmc", nargs="*", default=["esmc_300m", "esmc_600m"])
    parser.add_argument("--esmc-sequences", type=int, help="ESM C: the first N records only")
    parser.add_argument("--esmc-layers", type=int, help="ESM C: the first N layers only")
    parser.add_argument("--big", action=argparse.BooleanOptionalAction, default=None,
                        help="the largest models too (default: on a GPU)")  # fmt: skip
    parser.add_argument("--big-models", nargs="*", default=list(BIG))
    parser.add_argument("--big-layers", type=int, help="the largest models' first N layers only")
    parser.add_argument("--big-every", type=int, default=4,
                        help="the largest models on every N-th of the proteins")  # fmt: skip
    parser.add_argument("--fp8", action=argparse.BooleanOptionalAction, default=None,
                        help="ESM-2 and ESM C in fp8 too (default: where the device computes it)")  # fmt: skip
    parser.add_argument("--fp8-recipes", nargs="+", default=list(FP8_RECIPES),
                        choices=list(FP8_RECIPES), help="the FP8 recipes (`FP8_RECIPES`)")  # fmt: skip
    parser.add_argument("--big-error-sequences", type=int, default=16,
                        help="the largest models' error against fp32 on the first N of theirs")  # fmt: skip
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--precision", default="bf16", choices=["fp32", "bf16", "fp16"])
    parser.add_argument("--toks-per-batch", type=int, default=65536)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--profile", type=Path, help="where the profile of esmshard's sides goes")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if args.fp8 is None:
        args.fp8 = (
            device.type == "cpu" or torch.cuda.get_device_capability(device) >= FP8_CAPABILITY
        )
    with tempfile.TemporaryDirectory() as tmp:
        records = list(read_fasta(subset(args.fasta, args.every, Path(tmp) / "subset.fasta")))
        for name in args.esm2:
            sequences = [r.sequence[: ESM2.max_residues] for r in records]
            sides, layers_of = esm2_sides(name, sequences, args, device)
            if args.profile and name == args.esm2[0]:  # compiled already: batches alone
                profile(name, sides, device, args.profile)
            errors = {}
            if args.fp8:
                fresh = fresh_esm2(name)
                errors = fp8_errors(fresh, ESM2.archs[name].layers, sequences, args, device)
            measure(name, ESM2.archs[name], sides, layers_of, sequences, args, device, errors)
        for name in args.esmc if not skipped("ESM C's peers", "transformers") else []:
            chosen = records[: args.esmc_sequences]
            sequences = [r.sequence[: ESMC.max_residues] for r in chosen]
            sides, layers_of = esmc_sides(name, sequences, args, device, Path(tmp) / name)
            arch = ESMC.archs[name]
            arch = arch._replace(layers=args.esmc_layers or arch.layers)
            errors = {}
            if args.fp8:
                errors = fp8_errors(fresh_esmc(Path(tmp) / name), arch.layers, sequences, args,
                                    device)  # fmt: skip
            measure(name, arch, sides, layers_of, sequences, args, device, errors)
        if args.big if args.big is not None else device.type == "cuda":
            chosen = records[:: args.big_every]
            big([r.sequence[: ESM2.max_residues] for r in chosen], args, device)


if __name__ == "__main__":
    main()
