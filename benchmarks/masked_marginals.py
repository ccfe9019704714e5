"""Masked marginals of a whole proteome (every substitution of every protein): the work, its speed
here against fair-esm's predict.py loop, and its extrapolation to a pool of H100s.

    python benchmarks/masked_marginals.py --every 100 --layers 2
    python benchmarks/masked_marginals.py --device cuda --precision bf16 --layers 33 --every 400

The work is counted exactly on the whole proteome (`--fasta`, truncated at 1,022 residues as
ESM-2 and ESM-1v are): a protein of L residues costs L + 1 forward passes of L + 2 tokens. The
speed is measured on its every `--every`-th protein, with a random ESM-2 of `--model`'s width and
`--layers` of its layers (the layers are alike: the whole model's speed is the measured one
times layers / its layers), three sides alternating `--repeats` times on the same proteins:
predict.py's loop (fair-esm's model, one pass per masked position), and esmshard's Embedder
with masked copies padded and packed within `--toks-per-batch` in `--precision` (on a GPU
also packed through the compiled layer, compiled before the timed runs). predict.py's loop runs
in fp32 as predict.py does. The sides' masked marginals are checked to agree first (within 1e-3
in fp32; in bf16, within bf16's error of about 1e-2 of the values). One JSON line per side, then the extrapolation: this device's hours for
the whole proteome, and an H100 pool's from `--gpu-tokens-per-s` (the bf16 forward rate of the
650M model measured on an H100, docs/benchmarks.md; masked copies of one protein are of one
length, so packed batches hold no padding).
"""

import argparse
import copy
import json
import statistics
import tempfile
from pathlib import Path

import numpy as np
import torch
from peers import compiled_run, timed
from throughput import DEFAULT_FASTA, subset

from esmshard.compute.embedder import Embedder
from esmshard.compute.precision import PRECISIONS
from esmshard.input.fasta import read_fasta
from esmshard.models.archs import ESM2 as ARCHS

TRUNCATION = 1022
H100_650M_TOKENS_PER_S = 127_526  # docs/benchmarks.md, NVIDIA H100 2026-11-23, run 3


def proteome_work(fasta: Path) -> dict:
    lengths = np.array([min(len(r.sequence), TRUNCATION) for r in read_fasta(fasta)], np.int64)
    return {
        "proteins": int(lengths.size),
        "residues": int(lengths.sum()),
        "substitutions": int(19 * lengths.sum()),
        "embedding_tokens": int((lengths + 2).sum()),
        "masked_marginal_tokens": int(((lengths + 2) * (lengths + 1)).sum()),
    }


def predict_py_loop(model, alphabet, sequences):
    """fair-esm's examples/variant-prediction/predict.py, masked-marginals: a pass per position."""

    def run():
        found = []
        converter = alphabet.get_batch_converter()
        for sequence in sequences:
            _, _, tokens = converter([("protein", sequence)])
            tokens = tokens.to(next(model.parameters()).device)
            rows = []
            with torch.no_grad():
                for i in range(tokens.size(1)):
                    masked = tokens.clone()
                    masked[0, i] = alphabet.mask_idx
                    rows.append(torch.log_softmax(model(masked)["logits"], dim=-1)[0, i])
            found.append(torch.stack(rows)[1 : len(sequence) + 1])
        return found

    return run


def relative_error(got, want) -> float:
    return float(np.abs(got - want).mean() / np.abs(want).mean())


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fasta", type=Path, default=DEFAULT_FASTA)
    parser.add_argument("--model", default="esm2_t33_650M_UR50D", choices=sorted(ARCHS))
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--every", type=int, default=100)
    parser.add_argument("--longest", type=int, default=400, help="sampled proteins up to this")
    parser.add_argument("--toks-per-batch", type=int, default=16384)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    parser.add_argument("--gpu-tokens-per-s", type=float, default=H100_650M_TOKENS_PER_S)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from esm.model.esm2 import ESM2

    work = proteome_work(args.fasta)
    print(json.dumps({"proteome": str(args.fasta), **work}), flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        fasta = subset(args.fasta, args.every, Path(tmp) / "subset.fasta")
        sequences = [r.sequence for r in read_fasta(fasta) if len(r.sequence) <= args.longest]
    arch = ARCHS[args.model]
    torch.manual_seed(0)
    model = ESM2(args.layers, arch.dim, arch.heads, alphabet="ESM-1b").eval()
    device, precision = torch.device(args.device), PRECISIONS[args.precision]
    model = model.to(device)
    sides = {"predict.py loop": predict_py_loop(model, model.alphabet, sequences)}
    for batching in ("padded", "packed"):
        # its own copy: the Embedder places the weights in the precision's dtype
        embedder = Embedder(copy.deepcopy(model), model.alphabet, [args.layers], device,
                            precision, kinds=["masked_marginals"], packed=batching == "packed",
                            budget=args.toks_per_batch)  # fmt: skip
        sides[f"esmshard {batching}"] = lambda e=embedder: e.forward(sequences)
    if device.type == "cuda":
        # the packed side's embedder: compiled only while this side runs
        sides["esmshard packed compiled"], _ = compiled_run(
            lambda: embedder.forward(sequences), embedder, "ESM-2", precision.name
        )
    columns = [model.alphabet.get_idx(a) for a in "ACDEFGHIKLMNPQRSTVWY"]
    reference = [m[:, columns].cpu().numpy() for m in sides["predict.py loop"]()]
    errors = {}  # each side's to predict.py's fp32 masked marginals
    for name in list(sides)[1:]:
        got = [r[args.layers].masked_marginals for r in sides[name]()]
        if precision.name == "fp32":
            errors[name] = max(float(np.abs(a - b).max()) for a, b in zip(got, reference))
            assert errors[name] < 1e-3, (name, errors[name])
        else:  # bf16 keeps 8 bits of mantissa: about 1e-2 of the values, more over many layers
            errors[name] = max(relative_error(a, b) for a, b in zip(got, reference))
            assert errors[name] < 0.1, (name, errors[name])
    times = {name: [] for name in sides}
    for _ in range(args.repeats):
        for name, run in sides.items():
            times[name].append(timed(run, device))
    tokens = sum((len(s) + 2) * (len(s) + 1) for s in sequences)
    rates = {}
    for name in sides:
        rates[name] = tokens / statistics.median(times[name])
        print(json.dumps({
            "side": name, "model": args.model, "layers": args.layers, "threads": args.threads,
            "device": str(device), "precision": "fp32" if "loop" in name else precision.name,
            "proteins": len(sequences), "masked_tokens": tokens, "runs": times[name],
            "tokens_per_s": rates[name],
            "speedup_over_predict_py": rates[name] / rates["predict.py loop"],
            "error_to_predict_py": errors.get(name, 0.0),
            "error_kind": "max |difference|" if precision.name == "fp32" else "mean relative",
        }), flush=True)  # fmt: skip
    fastest = max((name for name in rates if name.startswith("esmshard")), key=rates.get)
    whole = rates[fastest] * args.layers / arch.layers  # the whole model's depth
    gpu_hours = work["masked_marginal_tokens"] / args.gpu_tokens_per_s / 3600
    print(json.dumps({
        "extrapolated": args.model, "device": str(device), "side": fastest,
        "this_device_tokens_per_s": whole,
        "this_device_hours": work["masked_marginal_tokens"] / whole / 3600,
        "h100_tokens_per_s": args.gpu_tokens_per_s,
        "h100_hours": gpu_hours,
        "h100_pool_hours": {str(n): gpu_hours / n for n in (1, 4, 8)},
    }), flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
