"""Packed against padded batches on this machine's device: the same proteins, the same budget.

    python benchmarks/batching.py --model esm2_t12_35M_UR50D --proteins 200 --repeats 3

The first `--proteins` records of `--fasta` (cut to 1022 residues) through esmshard's ESM-2
fast path (random weights of the model's real shapes), every kind read back, once with padded
batches and once packed, alternating, `--repeats` times; each side's batches as the embed step
plans them for `--budget` tokens. Prints, as JSON, each side's median seconds, padded/packed
(above 1: packing is faster), the padded batches' padding, and the largest difference between
the two sides' numbers.
"""

import argparse
import json
import statistics
import time

import numpy as np
import torch

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
                       PRECISIONS[args.precision], kinds=KINDS, packed=name == "packed")
        for name in ("padded", "packed")
    }  # fmt: skip
    plans = {name: make_batches(lengths, args.budget, name == "packed") for name in sides}
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
    layer = model.num_layers
    difference = max(
        float(np.abs(getattr(by_protein["padded"][i][layer], kind)
                     - getattr(by_protein["packed"][i][layer], kind)).max())
        for i in range(len(sequences)) for kind in KINDS
    )  # fmt: skip
    median = {name: statistics.median(s) for name, s in seconds.items()}
    print(json.dumps({
        "model": args.model, "device": str(device), "precision": args.precision,
        "threads": torch.get_num_threads(), "proteins": len(sequences), "budget": args.budget,
        "padded_seconds": median["padded"], "packed_seconds": median["packed"],
        "padded_over_packed": median["padded"] / median["packed"],
        "padding_of_padded_batches": padded_fraction(lengths, plans["padded"]),
        "largest_difference": difference,
    }, indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
