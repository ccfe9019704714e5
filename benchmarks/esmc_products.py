"""ESM C's input products as transformers' files hold them (q, k, v and gate, up apart) against
fused ones (one product each, as on a GPU and from EvolutionaryScale's .pth): speed.

    python benchmarks/esmc_products.py --every 40 --layers 4

A random ESM C of `--model`'s width and `--layers` of its layers, on the real proteome's every
`--every`-th protein: esmshard's forward pass with its products apart and with them fused
(the same weights), on the same batches, alternating `--repeats` times, on the device the
run is given (the CPU, where esmshard keeps them apart; a GPU fuses them). One JSON line per
side; the numbers of the two sides are checked to agree first.
"""

import argparse
import copy
import json
import statistics
import tempfile
from pathlib import Path

import numpy as np
import torch
from peers import esmshard_side, timed
from throughput import DEFAULT_FASTA, subset

from esmshard.compute.batching import make_batches
from esmshard.compute.embedder import Embedder
from esmshard.compute.precision import PRECISIONS
from esmshard.input.fasta import read_fasta
from esmshard.models.archs import ESMC as ARCHS
from esmshard.models.esmc import ALPHABET, ESMC, Shape, ffn_size


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fasta", type=Path, default=DEFAULT_FASTA)
    parser.add_argument("--model", default="esmc_300m", choices=sorted(ARCHS))
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--every", type=int, default=40)
    parser.add_argument("--toks-per-batch", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    precision = PRECISIONS["fp32" if device.type == "cpu" else "bf16"]
    with tempfile.TemporaryDirectory() as tmp:
        fasta = subset(args.fasta, args.every, Path(tmp) / "subset.fasta")
        sequences = [r.sequence[:2048] for r in read_fasta(fasta)]
    arch = ARCHS[args.model]._replace(layers=args.layers)
    torch.manual_seed(0)
    apart = ESMC(Shape(arch, ffn_size(arch.dim)), split=True).eval()
    fused = copy.deepcopy(apart)
    for block in fused.layers:
        block.attn_in.fuse()
        block.ffn_in.fuse()
    batches = make_batches([len(s) for s in sequences], args.toks_per_batch, True)
    embedders = {}
    for name, net in (("apart", apart), ("fused", fused)):
        embedders[name] = Embedder(net, ALPHABET, [arch.layers], device, precision,
                                   kinds=["mean"], packed=True)  # fmt: skip
    assert len(apart.layers[0].attn_in) == (3 if device.type == "cpu" else 1)
    check = sequences[:8]
    means = {n: [r[arch.layers].mean for r in e.forward(check)] for n, e in embedders.items()}
    error = max(float(np.abs(a - b).max()) for a, b in zip(means["apart"], means["fused"]))
    sides = {n: esmshard_side(e, sequences, batches) for n, e in embedders.items()}
    times = {name: [] for name in sides}
    for _ in range(args.repeats):
        for name, run in sides.items():
            times[name].append(timed(run, device))
    tokens = sum(len(s) + 2 for s in sequences)
    for name in sides:
        seconds = statistics.median(times[name])
        print(json.dumps({
            "model": args.model, "layers": args.layers, "products": name,
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "precision": precision.name, "threads": args.threads, "tokens": tokens,
            "runs": times[name], "tokens_per_s": tokens / seconds,
            "max_abs_difference_of_means": error,
        }), flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
