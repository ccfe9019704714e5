"""Forward-pass throughput: a peer against esmshard's fast path, same proteins, device, weights
and threads, in one process, alternating repetitions. For ESM-2 the peer is fair-esm's model
with its own batching; for ESM C it is transformers' EsmcModel (SDPA attention), for the T5
encoders (ProtT5, Ankh: t5_files.SHAPES, the first `--t5-layers` of their layers) transformers'
T5EncoderModel, each on esmshard's batches and tokens, the weights read by esmshard from the
folder transformers saved.

    python benchmarks/throughput.py --models esm2_t6_8M_UR50D esm2_t12_35M_UR50D --threads 2
    python benchmarks/throughput.py --models esmc_300m --every 40
    python benchmarks/throughput.py --models prot_t5_xl_uniref50 --t5-layers 2 --every 40
    python benchmarks/throughput.py --device cuda --precision bf16 --every 1 --toks-per-batch 65536

Reports residues/s, tokens/s (real tokens, BOS/EOS included) and achieved FLOP/s against the
measured matrix-product peak of the device in the same precision (the faster of torch's matmul
and, for fp32 on CPUs, oneDNN), plus the padded-token fraction of each shard of the whole
proteome as `shards: auto` cuts it. Weights are random (`random:`),
which does not change the arithmetic.
"""

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch
from esm.data import BatchConverter, FastaBatchedDataset

from esmshard.compute.batching import make_batches, padded_fraction
from esmshard.compute.embedder import Embedder
from esmshard.compute.precision import PRECISIONS
from esmshard.input.datasets import shared_data_dir
from esmshard.input.fasta import ALPHABET, read_fasta
from esmshard.input.sizing import ModelSize
from esmshard.models import ESM2, ESMC, T5, load, parse_spec
from esmshard.models.esm2 import random_model
from esmshard.models.layers import FP8, fp8_dense, onednn_available, onednn_dense, to_fp8
from esmshard.models.t5_files import SHAPES
from esmshard.models.t5_tokenizer import write_tokenizer
from esmshard.steps.shard import read_shard, write_shards

DEFAULT_FASTA = shared_data_dir() / "ecoli_k12_UP000000625.fasta"
TRUNCATION = 1022  # ESM-2's; ESM C's is its family's max_residues
ESM2_650M = ESM2.archs["esm2_t33_650M_UR50D"]
ESM2_650M_SIZE = ModelSize(12 * ESM2_650M.layers * ESM2_650M.dim**2, ESM2_650M.dim)


def subset(fasta: Path, every: int, out: Path) -> Path:
    """Every `every`-th record of `fasta` (all when 1), as a FASTA file."""
    text, index = [], -1
    for line in fasta.read_text().splitlines(keepends=True):
        if line.startswith(">"):
            index += 1
        if index % every == 0:
            text.append(line)
    out.write_text("".join(text))
    return out


def synchronize(device) -> None:
    """Wait for queued GPU work, so that timings cover it."""
    if device.type == "cuda":
        torch.cuda.synchronize()


def flops(lengths, layers, dim, params=None) -> float:
    """Dense layers 2·params per token (ESM: params 12·layers·D²), attention scores and mixing
    4·D per token pair and layer."""
    params = 12 * layers * dim**2 if params is None else params
    return sum(2 * params * n + layers * 4 * dim * n * n for n in lengths)


def matmul_peaks(dim, precision, device) -> dict[str, float]:
    """FLOP/s of a 4096 × D by D × 4D product (1024 × D on a CPU) through torch's matmul and, on
    CPUs, through oneDNN where it takes the precision (the fast path's library in fp32; in bf16
    the faster route on this CI's CPU, 424 against torch's matmul's 384 GFLOP/s at D = 960, and
    without it a compiled ESM C measured 1.09 of the peak) and in half precision as an fp32
    product of the values made fp32 (on a CPU without bf16 units, 17 GFLOP/s in bf16 against 100
    that way, which a compiled layer takes: it measured 1.02 of the bf16 peak), and on a GPU of an
    8192³ product (what its matrix units reach at best): the device's peak is the best of them.
    In fp8: the fast path's FP8 product (`fp8_dense`, the scaling of its rows included) and on a
    GPU an 8192³ FP8 product."""
    dtype = getattr(torch, PRECISIONS[precision].autocast_dtype or "float32")
    # A CPU's product of 1024 rows: gpu-check's CPU sides run batches of a few hundred tokens,
    # and 4096 rows in bf16 took 2 s a reading where the CPU has no bf16 units
    rows = 4096 if device.type == "cuda" else 1024
    a = torch.randn(rows, dim, device=device, dtype=dtype)
    linear = torch.nn.Linear(dim, 4 * dim, bias=False).to(device, dtype)
    if PRECISIONS[precision].fp8_products:  # the fast path's FP8 product, its scaling included
        to_fp8(linear)
        products = {"fp8 product": lambda: fp8_dense(a, linear)}
        if device.type == "cuda":
            square = torch.randn(8192, 8192, device=device).to(FP8)
            one = torch.ones((), device=device)
            products["8192³ fp8 matmul"] = lambda: torch._scaled_mm(
                square, square.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16
            )
    else:
        products = {"torch matmul": lambda: a @ linear.weight.T}
        if device.type == "cpu" and onednn_available():
            try:  # not every CPU's oneDNN takes half precision (fp16 here: no primitive)
                onednn_dense(a, linear)
                products["oneDNN"] = lambda: onednn_dense(a, linear)
            except RuntimeError:
                pass
        if device.type == "cpu" and dtype != torch.float32:
            weight = linear.weight.float()
            products["in fp32"] = lambda: (a.float() @ weight.T).to(dtype)
        if device.type == "cuda":  # the device's own peak: a large square product
            square = torch.randn(8192, 8192, device=device, dtype=dtype)
            products["8192³ matmul"] = lambda: square @ square
    # A reading times ten products on a GPU, where one ends before its launch is timed, and one
    # on a CPU, where one takes milliseconds (ten made the peak readings about 40% of the CPU
    # plan's peers stage); a CPU that other work shares gets more readings, the best kept.
    readings, per_reading = (5, 10) if device.type == "cuda" else (10, 1)
    peaks = {}
    with torch.inference_mode():
        for name, product in products.items():
            best = float("inf")
            for _ in range(readings):
                synchronize(device)
                start = time.perf_counter()
                for _ in range(per_reading):
                    product()
                synchronize(device)
                best = min(best, (time.perf_counter() - start) / per_reading)
            work = 2 * 8192**3 if name.startswith("8192") else 2 * rows * dim * 4 * dim
            peaks[name] = work / best
    return peaks


def peer(net, alphabet, fasta, toks_per_batch, device) -> float:
    """fair-esm's extract loop: its dataset, batching, converter and model, means kept."""
    dataset = FastaBatchedDataset.from_file(str(fasta))
    batches = dataset.get_batch_indices(toks_per_batch, extra_toks_per_seq=1)
    loader = torch.utils.data.DataLoader(
        dataset, collate_fn=BatchConverter(alphabet, TRUNCATION), batch_sampler=batches
    )
    layer = net.num_layers
    start = time.perf_counter()
    with torch.no_grad():
        for _, strs, toks in loader:
            reps = net(toks.to(device, non_blocking=True), repr_layers=[layer])["representations"][
                layer
            ]
            for i, s in enumerate(strs):
                reps[i, 1 : min(TRUNCATION, len(s)) + 1].mean(0).cpu()
    synchronize(device)
    return time.perf_counter() - start


def esmc_models(name: str, folder: Path, device, layers: int | None = None):
    """transformers' EsmcModel of the published shape `name`, its first `layers` layers (all by
    default; random weights, as transformers initialises them) and esmshard's ESMC with the same
    weights, read from the saved folder."""
    import transformers

    arch = ESMC.archs[name]
    layers, dim, heads = arch._replace(layers=layers or arch.layers)
    hf = transformers.EsmcModel(
        transformers.EsmcConfig(
            hidden_size=dim,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            intermediate_size=int((8 / 3 * dim + 255) // 256 * 256),
            attn_implementation="sdpa",
        )
    )
    hf.save_pretrained(folder)
    net, alphabet = load(parse_spec(str(folder)))
    return hf.eval().to(device), net.to(device), alphabet


def t5_models(name: str, layers: int, folder: Path, device):
    """transformers' T5EncoderModel of the published shape `name`, its first `layers` layers
    (random weights, as transformers initialises them), saved with a tokenizer, and esmshard's
    T5Encoder read from the folder."""
    import transformers

    (_, dim, heads), head_dim, ffn, feed_forward, buckets, distance, eps, vocab = SHAPES[name]
    hf = transformers.T5EncoderModel(
        transformers.T5Config(
            vocab_size=vocab, d_model=dim, d_kv=head_dim, d_ff=ffn, num_layers=layers,
            num_heads=heads, feed_forward_proj=feed_forward,
            relative_attention_num_buckets=buckets, relative_attention_max_distance=distance,
            layer_norm_epsilon=eps,
        )
    )  # fmt: skip
    hf.save_pretrained(folder)
    write_tokenizer(folder, "".join(sorted(ALPHABET)))
    spec = parse_spec(str(folder))
    net, alphabet = load(spec)
    return hf.eval().to(device), net.to(device), alphabet, spec.params


def transformers_peer(hf, embedder, sequences, toks_per_batch, device) -> float:
    """transformers' model on esmshard's batches and tokens, means over the residues kept."""
    batches = make_batches([len(s) for s in sequences], toks_per_batch)
    first = embedder.bos  # the first residue's column
    start = time.perf_counter()
    with torch.no_grad():
        for batch in batches:
            toks = embedder.tokens([sequences[i] for i in batch]).to(device)
            mask = toks.ne(embedder.alphabet.padding_idx)
            hidden = hf(input_ids=toks, attention_mask=mask).last_hidden_state
            for row, i in enumerate(batch):
                hidden[row, first : first + len(sequences[i])].mean(0).cpu()
    synchronize(device)
    return time.perf_counter() - start


def fast(net, alphabet, sequences, toks_per_batch, device, precision) -> tuple[float, float]:
    """esmshard's Embedder, means kept: seconds, and the host's own work among them (tokens,
    read-back, checks; esmshard.compute.embedder's host_seconds)."""
    embedder = Embedder(
        net, alphabet, [net.num_layers], device, PRECISIONS[precision], kinds=["mean"]
    )
    batches = make_batches([len(s) for s in sequences], toks_per_batch)
    start = time.perf_counter()
    for parts in embedder.embed_batches(
        ((b, [sequences[i] for i in b]) for b in batches), failed=[]
    ):
        for _, reps in parts:
            for rep in reps:
                rep[net.num_layers].mean
    synchronize(device)
    seconds = time.perf_counter() - start
    return seconds, embedder.host_seconds


def padding(fasta: Path, toks_per_batch: int, n_shards: int = 8) -> list[float]:
    """Padded fraction of each shard's batches, the file cut into `n_shards` (smaller shards
    than `shards: auto` makes of one proteome: fewer lengths to group, so more padding)."""
    with tempfile.TemporaryDirectory() as tmp:
        shards, store, cache = (Path(tmp) / name for name in ("shards", "store", "checksums"))
        settings = {"model": "padding only"}  # an empty store of its own: every record planned
        plan = write_shards(
            [fasta], shards, n_shards, TRUNCATION, ESM2_650M_SIZE, store, settings, cache
        )
        fractions = []
        for p in plan["shards"]:
            lengths = [
                min(len(sequence), TRUNCATION)
                for sequence in read_shard(shards / f"{p['shard']}.tsv").sequences
            ]
            fractions.append(padded_fraction(lengths, make_batches(lengths, toks_per_batch)))
        return fractions


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fasta", type=Path, default=DEFAULT_FASTA)
    parser.add_argument("--every", type=int, default=10, help="use every N-th record (1: all)")
    parser.add_argument("--models", nargs="+", default=["esm2_t6_8M_UR50D", "esm2_t12_35M_UR50D"])
    parser.add_argument("--t5-layers", type=int, default=2, help="T5 encoders: layers kept")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--precision",
        default="fp32",
        choices=["fp32", "bf16", "fp16"],
        help="the fast path's precision; the peer runs fp32, as fair-esm does",
    )
    parser.add_argument("--toks-per-batch", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)

    with tempfile.TemporaryDirectory() as tmp:
        fasta = subset(args.fasta, args.every, Path(tmp) / "subset.fasta")
        records = list(read_fasta(fasta))
        for name in args.models:
            params = None  # ESM's 12·layers·D²
            if name in SHAPES:
                family = T5
                layers, dim, _ = SHAPES[name].arch._replace(layers=args.t5_layers)
            else:
                family = parse_spec(f"random:{name}").family
                layers, dim, _ = family.archs[name]
            limit = family.max_residues
            sequences = [r.sequence[:limit] for r in records]
            lengths = [len(s) + 2 - (not family.bos) for s in sequences]
            if family is T5:
                peer_name = "transformers"
                hf, net, alphabet, params = t5_models(name, layers, Path(tmp) / name, device)
                tokens_of = Embedder(net, alphabet, [layers], device, PRECISIONS["fp32"])

                def run_peer():
                    return transformers_peer(hf, tokens_of, sequences, args.toks_per_batch, device)
            elif family is ESMC:
                peer_name = "transformers"
                hf, net, alphabet = esmc_models(name, Path(tmp) / name, device)
                tokens_of = Embedder(net, alphabet, [layers], device, PRECISIONS["fp32"])

                def run_peer():
                    return transformers_peer(hf, tokens_of, sequences, args.toks_per_batch, device)
            else:
                peer_name = "fair-esm"
                net = random_model(name).eval().to(device)
                alphabet = net.alphabet

                def run_peer():
                    return peer(net, alphabet, fasta, args.toks_per_batch, device)

            times = {peer_name: [], "esmshard": []}
            host_fractions = []  # of the fast path's time, the host's own work
            for _ in range(args.repeats):  # alternating, so drifts hit both sides alike
                times[peer_name].append(run_peer())
                seconds, host = fast(
                    net, alphabet, sequences, args.toks_per_batch, device, args.precision
                )
                times["esmshard"].append(seconds)
                host_fractions.append(host / seconds)
            work = flops(lengths, layers, dim, params)
            peaks_of = {
                precision: matmul_peaks(dim, precision, device)
                for precision in {"fp32", args.precision}
            }
            for side, precision in ((peer_name, "fp32"), ("esmshard", args.precision)):
                seconds = statistics.median(times[side])
                peaks = peaks_of[precision]
                peak = max(peaks.values())
                print(
                    json.dumps(
                        {
                            "model": name,
                            "side": side,
                            "precision": precision,
                            "device": str(device),
                            "threads": args.threads,
                            "sequences": len(sequences),
                            "residues": sum(map(len, sequences)),
                            "seconds": seconds,
                            "runs": times[side],
                            "residues_per_second": sum(map(len, sequences)) / seconds,
                            "tokens_per_second": sum(lengths) / seconds,
                            "achieved_gflops": work / seconds / 1e9,
                            "matmul_peak_gflops": peak / 1e9,
                            "matmul_gflops": {k: v / 1e9 for k, v in peaks.items()},
                            "fraction_of_peak": work / seconds / peak,
                            "peer": peer_name,
                            "speedup_vs_peer": statistics.median(times[peer_name]) / seconds,
                            "host_fraction": statistics.median(host_fractions)
                            if side == "esmshard"
                            else None,
                            "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}",
                        }
                    ),
                    flush=True,
                )
    fractions = padding(args.fasta, args.toks_per_batch)
    print(
        json.dumps(
            {
                "padded_fraction_per_shard": fractions,
                "max": max(fractions),
                "fasta": str(args.fasta),
                "toks_per_batch": args.toks_per_batch,
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
