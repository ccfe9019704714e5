"""Which of ESM-2's dense products FP8 can take: its error against fp32 with each kind of product
in FP8 and the others as bf16 computes them, on the same proteins and random weights.

    python benchmarks/fp8_layers.py --every 400 --threads 2     # a CPU: esm2_t33, 11 proteins
    python benchmarks/fp8_layers.py --device cuda --every 4
    python benchmarks/fp8_layers.py --choices all --scales row tensor 1x128 1x32 --threads 2

Prints one JSON line per choice of products in FP8 (`qkv` and `out`: the attention's products in
and out; `fc1` and `fc2`: the feed-forward's; `none`: bf16 alone) and of scales, with the
per-residue cosine to fp32 at the 1st percentile and the least protein's mean cosine, the two
goals `precision: fp8` is held to (0.999 and 0.9997). A CPU computes the same FP8 products as a
Hopper GPU, without the speed-up, so the error is measured on either.

`--scales`: how finely the values share a scale. `row` is `precision: fp8`'s own product (a scale
per token's row of activations and per row of the weight); the others are emulated, each operand
rounded to FP8 with its scales and back, then multiplied in fp32 (the FP8 product's numbers, up
to the order of its sums): `tensor`, one scale per operand; `1x128`, a scale per 128 values of a
token's row and per block of 128 x 128 weights (DeepSeek-V3's); `1x32`, a scale per 32 values of
either operand's rows (the MX formats' blocks); `delayed`, one scale per product kept from the
batches before (the largest magnitude they held; the first batch's own), values past FP8's
largest saturated, and a scale per row of the weight: quantization without a reduction before
the product (Transformer Engine's delayed scaling), which needs several batches
(`--toks-per-batch 512`).
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
from esmshard.models.layers import FP8, FP8_MAX, LEAST_SCALE, torch_dense

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
# (the activations' block, the weight's block) of each emulated scale: (rows, columns) sharing a
# scale, None for all of them; DELAYED for the activations: one scale kept from earlier batches
DELAYED = "delayed"
SCALES = {
    "row": None,  # `precision: fp8`'s own product
    "tensor": ((None, None), (None, None)),
    "1x128": ((1, 128), (128, 128)),
    "1x32": ((1, 32), (1, 32)),
    DELAYED: (DELAYED, (1, None)),
}


def rounded(t: torch.Tensor, rows: int | None, columns: int | None) -> torch.Tensor:
    """`t` (R x K) in fp32 as FP8 holds it with one scale per block of `rows` x `columns`
    values (None: all of them), the block's largest magnitude at FP8's largest."""
    t = t.float()
    height, width = rows or t.shape[0], columns or t.shape[1]
    padded = torch.nn.functional.pad(t, (0, -t.shape[1] % width, 0, -t.shape[0] % height))
    blocks = padded.view(padded.shape[0] // height, height, padded.shape[1] // width, width)
    scale = (blocks.abs().amax(dim=(1, 3), keepdim=True) / FP8_MAX).clamp(min=LEAST_SCALE)
    values = ((blocks / scale).to(FP8).float() * scale).view(padded.shape)
    return values[: t.shape[0], : t.shape[1]]


def rounded_delayed(t: torch.Tensor, linear) -> torch.Tensor:
    """`t` in fp32 as FP8 holds it with one scale from the largest magnitude that `linear`'s
    earlier batches held (the first batch: its own), values past FP8's largest saturated: a
    quantization with no reduction before it. The largest magnitude seen is updated after."""
    t = t.float()
    largest = t.abs().amax()
    seen = getattr(linear, "largest_seen", largest)
    scale = (seen / FP8_MAX).clamp(min=LEAST_SCALE)
    linear.largest_seen = torch.maximum(seen, largest)
    return (t / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8).float() * scale


def emulate_fp8(net, products, scales) -> None:
    """`products` of `net` computed as FP8 with `scales` would compute them (`SCALES`): the
    weights rounded once, each batch's activations at every product, the sums in fp32 and one
    rounding to bf16 as `torch._scaled_mm` gives them."""
    activations, weights = scales
    for linear in products:
        linear.rounded_weight = rounded(linear.weight.detach(), *weights)

    def dense(x, linear, gelu=False, residual=None):
        if not hasattr(linear, "rounded_weight"):
            return torch_dense(x, linear, gelu, residual)
        rows = x.reshape(-1, x.shape[-1])
        if activations == DELAYED:
            rows = rounded_delayed(rows, linear)
        else:
            rows = rounded(rows, *activations)
        with torch.autocast(x.device.type, enabled=False):
            out = torch.addmm(linear.bias.float(), rows, linear.rounded_weight.t())
        out = out.to(torch.bfloat16).view(*x.shape[:-1], out.shape[-1])
        if gelu:
            out = torch.nn.functional.gelu(out)
        return out if residual is None else residual + out

    net.dense_for = lambda x: dense  # the instance's own, over FastForward's


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fasta", type=Path, default=DEFAULT_FASTA)
    parser.add_argument("--every", type=int, default=400, help="every N-th record (1: all)")
    parser.add_argument("--model", default="esm2_t33_650M_UR50D")
    parser.add_argument("--choices", nargs="+", default=list(CHOICES), choices=list(CHOICES))
    parser.add_argument("--scales", nargs="+", default=["row"], choices=list(SCALES))
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
        for scales in args.scales if CHOICES[choice] else ["row"]:
            bf16 = embedder("bf16")
            products = [p for i, p in enumerate(bf16.net.dense_products())
                        if ROLES[i % len(ROLES)] in CHOICES[choice]]  # fmt: skip
            if products and SCALES[scales]:
                emulate_fp8(bf16.net, products, SCALES[scales])
            elif products:
                bf16.net.use_fp8(products)
            got = embedded(bf16, layer, sequences, args)
            row = {"model": args.model, "fp8_products": choice, "scales": scales,
                   "device": str(device), "sequences": len(sequences),
                   "residues": sum(map(len, sequences))}  # fmt: skip
            print(json.dumps({**row, **error_against(want, got)}), flush=True)


if __name__ == "__main__":
    main()
