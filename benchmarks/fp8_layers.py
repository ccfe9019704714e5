"""Which of ESM-2's dense products FP8 can take: its error against fp32 with each kind of product
in FP8 and the others as bf16 computes them, on the same proteins and random weights.

    python benchmarks/fp8_layers.py --every 400 --threads 2     # a CPU: esm2_t33, 11 proteins
    python benchmarks/fp8_layers.py --device cuda --every 4

Prints one JSON line per choice of products in FP8 (`qkv` and `out`: the attention's products in
and out; `fc1` and `fc2`: the feed-forward's; `none`: bf16 alone) with the per-residue cosine to
fp32 at the 1st percentile and the least protein's mean cosine, the two goals `precision: fp8`
is held to (0.999 and 0.9997). A CPU computes the same FP8 products as a Hopper GPU, without the
speed-up, so the error is measured on either.
"""

import argparse
import json
import tempfile
from pathlib import Path

import torch
from peers import embedded, error_against, fresh_esm2
from throughput import DEFAULT_FASTA, subset

from esmshard.compute.embedder import Embedder
from esmshard.compute.precision import PRECISIONS
from esmshard.input.fasta import read_fasta
from esmshard.models import ESM2

# ESM-2's dense products as `dense_products` lists them, layer by layer.
ROLES = ("qkv", "out", "fc1", "fc2")
CHOICES = {
    "none": (),
    "qkv": ("qkv",),
    "out": ("out",),
    "fc1": ("fc1",),
    "fc2": ("fc2",),
    "attention": ("qkv", "out"),
    "feed-forward": ("fc1", "fc2"),
    "all": ROLES,
}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fasta", type=Path, default=DEFAULT_FASTA)
    parser.add_argument("--every", type=int, default=400, help="every N-th record (1: all)")
    parser.add_argument("--model", default="esm2_t33_650M_UR50D")
    parser.add_argument("--choices", nargs="+", default=list(CHOICES), choices=list(CHOICES))
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--toks-per-batch", type=int, default=4096)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    with tempfile.TemporaryDirectory() as tmp:
        records = list(read_fasta(subset(args.fasta, args.every, Path(tmp) / "subset.fasta")))
    sequences = [r.sequence[: ESM2.max_residues] for r in records]
    layer = ESM2.archs[args.model].layers
    fresh = fresh_esm2(args.model)

    def embedder(precision):
        return Embedder(*fresh(), [layer], device, PRECISIONS[precision],
                        kinds=["mean", "per_tok"], packed=True)  # fmt: skip

    want = embedded(embedder("fp32"), layer, sequences, args)
    for choice in args.choices:
        bf16 = embedder("bf16")
        if CHOICES[choice]:
            products = bf16.net.dense_products()
            bf16.net.use_fp8([p for i, p in enumerate(products)
                              if ROLES[i % len(ROLES)] in CHOICES[choice]])  # fmt: skip
        got = embedded(bf16, layer, sequences, args)
        row = {"model": args.model, "fp8_products": choice, "device": str(device),
               "sequences": len(sequences), "residues": sum(map(len, sequences))}  # fmt: skip
        print(json.dumps({**row, **error_against(want, got)}), flush=True)


if __name__ == "__main__":
    main()
