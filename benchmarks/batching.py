"""Packed against padded batches, and packed batches through the compiled layer, on this
machine's device: the same proteins, the same budget.

    python benchmarks/batching.py --model esm2_t12_35M_UR50D --proteins 200 --repeats 3

The first `--proteins` records of `--fasta` (cut to 1022 residues) through esmshard's ESM-2
fast path (random weights of the model's real shapes), every kind read back, with padded
batches, packed ones, and packed ones through the layer `compile: on` compiles (its compilation
done before the first repetition, timed apart), alternating, `--repeats` times; each side's
batches as the embed step plans them for `--budget` tokens. Prints, as JSON, each side's median
seconds, padded/packed and packed/compiled (above 1: the second is faster), the seconds spent
compiling, the padded batches' padding, and the largest differences between the sides' numbers.
"""

import argparse
import json
import statistics
import time

import numpy as np
import torch

from esmshard.compute import compiled
from esmshard.compute.batching import make_batches, padded_fraction
from esmshard.compute.embedder import Embedder
from esmshard.compute.precision import PRECISIONS
from esmshard.input.fasta import read_fasta
from esmshard.models.esm2 import random_model

KINDS = ("mean", "per_tok", "bos")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="esm2_t12_35M_UR50D")
    parser.add_argument("--fasta", default="../shared/data/ecoli_k12_UP000000625.fasta")
    parser.add_argument("--proteins", type=int, default=200)
    parser.add_argument("--budget", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--precision", default="fp32", choices=sorted(PRECISIONS))
    args = parser.parse_args()
    records = read_fasta(args.fasta)
    sequences = [next(records).sequence[:1022] for _ in range(args.proteins)]
    lengths = [len(s) for s in sequences]
    model = random_model(args.model).eval()
    device = torch.device(args.device)
    sides = {
        name: Embedder(model, model.alphabet, [model.num_layers], device,
                       PRECISIONS[args.precision], kinds=KINDS, packed=name != "padded")
        for name in ("padded", "packed", "compiled")
    }  # fmt: skip
    net = sides["compiled"].net
    key = compiled.CacheKey.of(device, "ESM-2", net, args.precision, "packed")
    layer = compiled.Compiled(net, key, None)  # no cache: this process compiles it all
    layer.start()
    plans = {name: make_batches(lengths, args.budget, name != "padded") for name in sides}
    sides["compiled"].forward([sequences[i] for i in plans["compiled"][0]])  # compiles
    seconds, results = {name: [] for name in sides}, {}
    for _ in range(args.repeats):
        for name, embedder in sides.items():
            started = time.perf_counter()
            results[name] = [
                rep for b in plans[name] for rep in embedder.forward([sequences[i] for i in b])
            ]
            if device.type == "cuda":
                torch.cuda.synchronize()
            seconds[name].append(time.perf_counter() - started)
    by_protein = {
        name: dict(zip([i for b in plans[name] for i in b], reps))
        for name, reps in results.items()
    }
    layer.finish()

    def difference(one, other):
        return max(
            float(np.abs(getattr(by_protein[one][i][model.num_layers], kind)
                         - getattr(by_protein[other][i][model.num_layers], kind)).max())
            for i in range(len(sequences)) for kind in KINDS
        )  # fmt: skip

    median = {name: statistics.median(s) for name, s in seconds.items()}
    print(json.dumps({
        "model": args.model, "device": str(device), "precision": args.precision,
        "threads": torch.get_num_threads(), "proteins": len(sequences), "budget": args.budget,
        **{f"{name}_seconds": median[name] for name in sides},
        "padded_over_packed": median["padded"] / median["packed"],
        "packed_over_compiled": median["packed"] / median["compiled"],
        "compile_seconds": layer.seconds, "compiled_graphs": layer.graphs,
        "padding_of_padded_batches": padded_fraction(lengths, plans["padded"]),
        "largest_difference_packed_padded": difference("packed", "padded"),
        "largest_difference_compiled_packed": difference("compiled", "packed"),
    }, indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
