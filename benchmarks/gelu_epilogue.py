"""ESM-2's GELU in the fc1 product's epilogue against the exact GELU after it: speed and error.

    python benchmarks/gelu_epilogue.py --every 4 --toks-per-batch 65536

On a CUDA GPU in bf16 (esm2_t33_650M's shape, random weights, the real proteome's every
`--every`-th protein): esmshard's packed forward pass, eager and compiled, with each GELU, on the
same batches, alternating `--repeats` times; then each GELU's error against the fp32 forward pass
(padded, eager, the exact GELU: the path tested equal to fair-esm's) on every `--error-every`-th of
those proteins, over every residue's last-layer row and every protein's mean. One JSON line per
side and per error.
"""

import argparse
import json
import statistics
import tempfile
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from peers import compiled_side, esmshard_side, timed
from throughput import DEFAULT_FASTA, subset

import esmshard.models.layers as layers
from esmshard.compute.batching import make_batches
from esmshard.compute.embedder import Embedder
from esmshard.compute.precision import PRECISIONS
from esmshard.input.fasta import read_fasta
from esmshard.models.esm2 import random_model

EPILOGUE = layers.torch_dense


def after_product(x, linear, gelu=False, residual=None):
    """esmshard's dense layer with the exact GELU applied after the product (no epilogue)."""
    if gelu:
        return F.gelu(EPILOGUE(x, linear))
    return EPILOGUE(x, linear, residual=residual)


GELUS = {"exact GELU after the product": after_product, "GELU in the epilogue": EPILOGUE}


@contextmanager
def gelu(name):
    """esmshard's dense layers with the GELU `name` while inside."""
    layers.torch_dense = GELUS[name]
    try:
        yield
    finally:
        layers.torch_dense = EPILOGUE


def within(name, run):
    def run_with():
        with gelu(name):
            run()

    return run_with


def rows(embedder, sequences, layer):
    """Every residue's row and every protein's mean at `layer`, in fp32, in order."""
    batches = make_batches([len(s) for s in sequences], 8192, embedder.packed)
    out = {}
    for parts in embedder.embed_batches(((b, [sequences[i] for i in b]) for b in batches), []):
        for done, reps in parts:
            out.update(zip(done, (rep[layer] for rep in reps)))
    ordered = [out[i] for i in range(len(sequences))]
    per_tok = np.concatenate([r.per_tok.astype(np.float32) for r in ordered])
    return per_tok, np.stack([r.mean.astype(np.float32) for r in ordered])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fasta", type=Path, default=DEFAULT_FASTA)
    parser.add_argument("--model", default="esm2_t33_650M_UR50D")
    parser.add_argument("--every", type=int, default=4)
    parser.add_argument("--error-every", type=int, default=10)
    parser.add_argument("--toks-per-batch", type=int, default=65536)
    parser.add_argument("--repeats", type=int, default=3)
    # on a CPU both sides take the exact GELU: a check of this script's plumbing only
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    device = torch.device(args.device)
    torch._dynamo.config.recompile_limit = 64  # two GELUs' graphs for one layer's code
    with tempfile.TemporaryDirectory() as tmp:
        fasta = subset(args.fasta, args.every, Path(tmp) / "subset.fasta")
        sequences = [r.sequence[:1022] for r in read_fasta(fasta)]
    net = random_model(args.model).eval().to(device)
    last = net.num_layers
    bf16 = PRECISIONS["bf16"]
    batches = make_batches([len(s) for s in sequences], args.toks_per_batch, True)
    sides, compiled = [], []
    for name in GELUS:
        eager = Embedder(net, net.alphabet, [last], device, bf16, kinds=["mean"], packed=True)
        sides.append((name, "eager", within(name, esmshard_side(eager, sequences, batches))))
        embedder = Embedder(net, net.alphabet, [last], device, bf16, kinds=["mean"], packed=True)
        with gelu(name):
            run, layer = compiled_side(embedder, sequences, batches, "ESM-2", "bf16")
        sides.append((name, "compiled", within(name, run)))
        compiled.append(layer)
    times = {(name, mode): [] for name, mode, _ in sides}
    for _ in range(args.repeats):
        for name, mode, run in sides:
            times[name, mode].append(timed(run, device))
    tokens = sum(len(s) + 2 for s in sequences)
    for name, mode, _ in sides:
        seconds = statistics.median(times[name, mode])
        print(json.dumps({
            "model": args.model, "gelu": name, "mode": mode, "precision": "bf16",
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "tokens": tokens,
            "runs": times[name, mode], "tokens_per_s": tokens / seconds,
        }), flush=True)  # fmt: skip
    for layer in compiled:
        layer.finish()

    checked = sequences[:: args.error_every]
    reference = Embedder(net, net.alphabet, [last], device, PRECISIONS["fp32"])
    want_rows, want_means = rows(reference, checked, last)
    scale = float(np.abs(want_rows).mean())
    for name in GELUS:
        embedder = Embedder(net, net.alphabet, [last], device, bf16, packed=True)
        with gelu(name):
            got_rows, got_means = rows(embedder, checked, last)
        row_error, mean_error = np.abs(got_rows - want_rows), np.abs(got_means - want_means)
        cosine = (got_rows * want_rows).sum(1) / (
            np.linalg.norm(got_rows, axis=1) * np.linalg.norm(want_rows, axis=1)
        )
        print(json.dumps({
            "model": args.model, "gelu": name, "precision": "bf16", "against": "fp32",
            "proteins": len(checked), "residues": len(want_rows), "mean_abs_value": scale,
            "per_tok_max_abs_error": float(row_error.max()),
            "per_tok_mean_abs_error": float(row_error.mean()),
            "per_tok_min_cosine": float(cosine.min()),
            "mean_max_abs_error": float(mean_error.max()),
            "mean_mean_abs_error": float(mean_error.mean()),
        }), flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
