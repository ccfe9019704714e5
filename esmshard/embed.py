"""Embedding one shard: batching, the forward pass, and the shard's output files."""
import json
import logging
import os
import socket
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import h5py
import numpy as np
import torch

from . import model as esm_model
from . import pool, telemetry
from .forward import FastESM2
from .merge import STR_DTYPE
from .shard import chunk_spans, embedded_residues, read_tsv
from .status import rate

log = logging.getLogger(__name__)

INCLUDE_KINDS = ("mean", "per_tok", "bos")
# Test hook: batches of more tokens than this raise an out-of-memory error, as CUDA would.
INJECT_OOM_ENV = "ESMSHARD_INJECT_OOM_TOKENS"


def resolve_precision(precision: str, device: torch.device) -> str:
    if precision != "auto":
        return precision
    if device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 0):
        return "bf16"
    return "fp32"


AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def absolute_layers(repr_layers, num_layers: int) -> list[int]:
    """fair-esm's convention: negative layers count from the end; 0 is the embedding layer."""
    layers = []
    for layer in repr_layers:
        if not -(num_layers + 1) <= layer <= num_layers:
            raise ValueError(f"repr_layers: layer {layer} does not exist in a {num_layers}-layer model")
        layers.append((layer + num_layers + 1) % (num_layers + 1))
    return sorted(set(layers))


def make_batches(lengths, toks_per_batch) -> list[list[int]]:
    """Longest first, each batch as many sequences as fit the token budget once padded.

    `toks_per_batch` is a number or a function of the batch's longest sequence (in tokens).
    A sequence longer than the budget gets a batch of its own.
    """
    budget_for = toks_per_batch if callable(toks_per_batch) else (lambda _: toks_per_batch)
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    batches, current, width, budget = [], [], 0, 0
    for i in order:
        tokens = lengths[i] + 2  # BOS and EOS
        if not current:
            budget = budget_for(tokens)
        width = max(width, tokens)
        if current and width * (len(current) + 1) > budget:
            batches.append(current)
            current, width, budget = [], tokens, budget_for(tokens)
        current.append(i)
    if current:
        batches.append(current)
    return batches


def padded_fraction(lengths, batches) -> float:
    """Share of the batches' tokens that are padding (BOS/EOS count as real tokens)."""
    padded = sum((max(lengths[i] for i in batch) + 2) * len(batch) for batch in batches)
    return 1 - sum(lengths[i] + 2 for batch in batches for i in batch) / padded if padded else 0.0


# ESM-2 was trained on at most 1022 residues plus BOS and EOS.
MODEL_MAX_TOKENS = 1024
CPU_TOKENS_PER_BATCH = 4096  # on a CPU larger batches do not run faster
MAX_AUTO_TOKENS = 1 << 20
BYTES_PER_VALUE = {"fp32": 4, "bf16": 3, "fp16": 3}  # autocast keeps norms and softmax in fp32


def auto_token_budget(free_bytes: int, model_bytes: int, embed_dim: int, heads: int, longest_tokens: int,
                      precision: str = "fp32") -> int:
    """Tokens per batch that fit the device's free memory next to the model.

    Per token a layer holds about 16·D activations (residual, norms, q/k/v, output, the 4·D
    feed-forward in and out) and, as fair-esm materialises attention, 3·H·L scores for the
    batch's longest sequence L (clamped to the model's maximum length). 20% is kept in reserve.
    """
    longest = min(longest_tokens, MODEL_MAX_TOKENS)
    per_token = BYTES_PER_VALUE[precision] * (16 * embed_dim + 3 * heads * longest)
    usable = 0.8 * free_bytes - model_bytes
    return int(max(longest, min(MAX_AUTO_TOKENS, usable // per_token)))


class Embedder:
    """fair-esm's ESM-2 forward pass with fair-esm's token layout, on one device."""

    def __init__(self, model, alphabet, layers, device, precision, fast_path=True):
        self.model = model.to(device)
        self.net = FastESM2(self.model) if fast_path else self.model
        self.alphabet = alphabet
        self.layers = layers
        self.device = device
        self.precision = precision
        self.inject_oom_tokens = int(os.environ.get(INJECT_OOM_ENV, 0)) or None
        # Token of each byte that is a one-letter token of the alphabet, -1 for the others.
        self.token_of_byte = np.full(256, -1, dtype=np.int64)
        for token, index in alphabet.tok_to_idx.items():
            if len(token) == 1:
                self.token_of_byte[ord(token)] = index

    def tokens(self, sequences: list[str]) -> torch.Tensor:
        """fair-esm's batch layout (BOS, residues, EOS, padding) from one table lookup per batch.

        Encoding residue by residue in Python, as fair-esm's converter does, manages about 0.3M
        residues/s: on a GPU that would take longer than the forward pass.
        """
        lengths = np.array([len(s) for s in sequences])
        residues = self.token_of_byte[np.frombuffer("".join(sequences).encode("ascii"), dtype=np.uint8)]
        if (residues < 0).any():
            raise ValueError("a sequence holds characters that are not ESM-2 residue tokens")
        toks = np.full((len(sequences), lengths.max() + 2), self.alphabet.padding_idx, dtype=np.int64)
        rows = np.repeat(np.arange(len(sequences)), lengths)
        toks[rows, np.arange(len(residues)) - np.repeat(np.cumsum(lengths) - lengths, lengths) + 1] = residues
        toks[:, 0] = self.alphabet.cls_idx
        toks[np.arange(len(sequences)), lengths + 1] = self.alphabet.eos_idx
        return torch.from_numpy(toks)

    def launch(self, sequences: list[str]):
        """Start the batch's forward pass; `finish` reads the results back.

        On a GPU both the forward pass and the copy of its results into pinned host memory are
        queued, so the host is free until it asks for them.
        """
        toks = self.tokens(sequences)
        if self.device.type == "cuda":
            toks = toks.pin_memory()  # lets the copy below overlap with queued GPU work
        if self.inject_oom_tokens and toks.numel() > self.inject_oom_tokens:
            raise torch.OutOfMemoryError(f"injected: batch of {toks.numel()} tokens")
        dtype = AUTOCAST_DTYPES.get(self.precision)
        with torch.inference_mode(), torch.autocast(self.device.type, dtype=dtype, enabled=dtype is not None):
            out = self.net(toks.to(self.device, non_blocking=True), repr_layers=self.layers)
            reps = {layer: rep.float() for layer, rep in out["representations"].items()}
            if self.device.type != "cuda":
                return reps, None
            host = {layer: torch.empty(rep.shape, dtype=torch.float32, pin_memory=True).copy_(rep, non_blocking=True)
                    for layer, rep in reps.items()}
            copied = torch.cuda.Event()
            copied.record()
            return host, copied

    @staticmethod
    def finish(launched, sequences: list[str]) -> list[dict]:
        """Per sequence, {layer: (per-residue array, BOS array)}, float32 on the CPU."""
        reps, copied = launched
        if copied is not None:
            copied.synchronize()
        arrays = {layer: rep.numpy() for layer, rep in reps.items()}
        return [
            {layer: (rep[row, 1:len(seq) + 1], rep[row, 0]) for layer, rep in arrays.items()}
            for row, seq in enumerate(sequences)
        ]

    def forward(self, sequences: list[str]) -> list[dict]:
        return self.finish(self.launch(sequences), sequences)

    def launch_halving(self, indices: list[int], sequences: list[str], failed: list) -> list[tuple]:
        """`launch` the batch, or on out-of-memory its halves, down to single sequences.

        Returns (indices, sequences, launched) per part; a sequence that does not fit even alone
        is appended to `failed` as (index, reason).
        """
        try:
            return [(indices, sequences, self.launch(sequences))]
        except torch.OutOfMemoryError as err:
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
            if len(sequences) == 1:
                failed.append((indices[0], f"out of memory even alone ({len(sequences[0])} residues): {err}"))
                return []
            half = len(sequences) // 2
            log.warning("out of memory on a batch of %d sequences; retrying as two halves", len(sequences))
            return (self.launch_halving(indices[:half], sequences[:half], failed)
                    + self.launch_halving(indices[half:], sequences[half:], failed))

    def finish_checked(self, parts: list[tuple], failed: list) -> list[tuple]:
        """(indices, representations) per launched part, sequences with non-finite values moved to `failed`."""
        results = []
        for indices, sequences, launched in parts:
            kept = []
            for index, rep in zip(indices, self.finish(launched, sequences)):
                if all(np.isfinite(per_tok).all() and np.isfinite(bos).all() for per_tok, bos in rep.values()):
                    kept.append((index, rep))
                else:
                    failed.append((index, "non-finite values in the representations"))
            if kept:
                results.append(([i for i, _ in kept], [r for _, r in kept]))
        return results

    def embed(self, indices: list[int], sequences: list[str], failed: list) -> list[tuple]:
        """(indices, representations) for the batch, halving it on out-of-memory.

        A sequence that fails on its own is appended to `failed` as (index, reason).
        """
        return self.finish_checked(self.launch_halving(indices, sequences, failed), failed)

    def embed_batches(self, batches, failed: list):
        """Yield `embed`'s result for each (indices, sequences) of `batches`, in order.

        Each batch is launched before the previous one's results are read back, so that a GPU
        computes while the host copies, checks and writes the batch before.
        """
        previous = None
        for indices, sequences in batches:
            parts = self.launch_halving(indices, sequences, failed)
            if previous is not None:
                yield self.finish_checked(previous, failed)
            previous = parts
        if previous is not None:
            yield self.finish_checked(previous, failed)

    def embed_chunked(self, index: int, sequence: str, window: int, failed: list) -> dict | None:
        """One long sequence through overlapping windows, stitched; None (and `failed` noted) if a window fails."""
        spans = chunk_spans(len(sequence), window)
        pieces, window_failures = {}, []
        for done, reps in self.embed(list(range(len(spans))), [sequence[a:b] for a, b, _, _ in spans], window_failures):
            pieces.update(zip(done, reps))
        if window_failures:
            k, reason = window_failures[0]
            failed.append((index, f"window {k + 1} of {len(spans)} failed: {reason}"))
            return None
        return {
            layer: (
                np.concatenate([pieces[k][layer][0][keep_from - a:keep_to - a]
                                for k, (a, _, keep_from, keep_to) in enumerate(spans)]),
                pieces[0][layer][1],
            )
            for layer in pieces[0]
        }


class ShardWriter:
    """Appends batches to the shard's HDF5 file, rows in processing order with their input index."""

    def __init__(self, h5: h5py.File, layers, include, dim):
        self.h5 = h5
        self.include = include
        for name, dtype in (("index", np.int64), ("length", np.int64)):
            h5.create_dataset(name, (0,), dtype=dtype, maxshape=(None,), chunks=True)
        h5.create_dataset("ids", (0,), dtype=STR_DTYPE, maxshape=(None,), chunks=True)
        for kind in include:
            for layer in layers:
                h5.create_dataset(f"{kind}/{layer}", (0, dim), dtype=np.float32, maxshape=(None, dim), chunks=True)

    @staticmethod
    def _append(dset, rows: np.ndarray):
        start = dset.shape[0]
        dset.resize(start + len(rows), axis=0)
        dset[start:] = rows

    def write(self, indices, ids, reps):
        self._append(self.h5["index"], np.asarray(indices, dtype=np.int64))
        self._append(self.h5["ids"], np.asarray(ids, dtype=object))
        self._append(self.h5["length"], np.asarray([len(next(iter(r.values()))[0]) for r in reps], dtype=np.int64))
        for layer in reps[0]:
            per_tok = [r[layer][0] for r in reps]
            summaries = {
                "mean": lambda: np.stack([p.mean(0) for p in per_tok]),
                "per_tok": lambda: np.concatenate(per_tok),
                "bos": lambda: np.stack([r[layer][1] for r in reps]),
            }
            for kind in self.include:
                self._append(self.h5[f"{kind}/{layer}"], summaries[kind]())

    def write_failed(self, failed, ids_by_index):
        failed = sorted(failed)
        self.h5.create_dataset("failed/index", data=np.array([i for i, _ in failed], dtype=np.int64))
        self.h5.create_dataset("failed/ids", data=np.array([ids_by_index[i] for i, _ in failed], dtype=object), dtype=STR_DTYPE)
        self.h5.create_dataset("failed/reason", data=np.array([r for _, r in failed], dtype=object), dtype=STR_DTYPE)


def write_json_atomically(path: Path, data: dict) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)


def split_records(rows, limit: int, long_sequences: str):
    """The residues each record is embedded with, and which records go batched, chunked or skipped."""
    sequences, batched, chunked, skipped = [], [], [], []
    for k, r in enumerate(rows):
        kept = embedded_residues(len(r["sequence"]), limit, long_sequences)
        if kept == 0:
            skipped.append((k, f"longer than truncation_seq_length ({len(r['sequence'])} > {limit} residues); "
                               f"skipped (long_sequences: {long_sequences})"))
        elif kept > limit:
            chunked.append(k)
        else:
            batched.append(k)
        sequences.append(r["sequence"][:kept])
    return sequences, batched, chunked, skipped


def pick_device(slot: pool.Slot, threads: int) -> tuple[torch.device, str]:
    if torch.cuda.is_available():
        device = torch.device("cuda", 0)
        return device, torch.cuda.get_device_name(device)
    if slot.cuda_visible_devices:
        log.warning("slot %s is GPU %s, but this torch cannot use CUDA (a CPU-only build, or no driver): "
                    "computing on the CPU", slot.index, slot.cuda_visible_devices)
    log.info("no CUDA device available: computing on the CPU with %d threads", threads)
    return torch.device("cpu"), "cpu"


def token_budget(toks_per_batch, device, net, precision):
    """The budget make_batches uses: the configured number, or one sized to the device's memory.

    Called before the model moves to the device, so free memory still includes its place.
    """
    if toks_per_batch != "auto":
        return toks_per_batch
    if device.type != "cuda":
        return CPU_TOKENS_PER_BATCH
    free = torch.cuda.mem_get_info(device)[0]
    model_bytes = sum(p.numel() * p.element_size() for p in net.parameters())
    heads = net.layers[0].self_attn.num_heads
    return lambda longest: auto_token_budget(free, model_bytes, net.embed_dim, heads, longest, precision)


class Progress:
    """`running/<shard>.json`, rewritten after each batch for `esmshard status`; removed at the end."""

    def __init__(self, path, **fields):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.fields = {**fields, "residues_done": 0}

    def update(self, residues: int, sampler=None):
        self.fields["residues_done"] += residues
        self.fields["updated_at"] = time.time()
        if sampler is not None and sampler.samples:
            self.fields["memory_used_bytes"] = sampler.samples[-1]["memory_used_bytes"]
            self.fields["memory_total_bytes"] = sampler.samples[-1]["memory_total_bytes"]
        write_json_atomically(self.path, self.fields)

    def close(self):
        self.path.unlink(missing_ok=True)


def run_shard(shard_tsv, out_h5, metrics_json, *, shard, model, repr_layers, include, toks_per_batch,
              truncation_seq_length, long_sequences, precision, fast_path, gpus, threads, progress_json,
              telemetry_tsv):
    """Embed one shard's sequences on a pooled device and write its outputs atomically."""
    out_h5, metrics_json = Path(out_h5), Path(metrics_json)
    rows = read_tsv(shard_tsv)
    indices = [int(r["index"]) for r in rows]
    ids = [r["id"] for r in rows]
    limit = truncation_seq_length
    sequences, batched, chunked, failed = split_records(rows, limit, long_sequences)
    n_residues = sum(len(sequences[k]) for k in batched + chunked)
    spec = esm_model.parse_spec(model)
    torch.set_num_threads(threads)
    Path(telemetry_tsv).parent.mkdir(parents=True, exist_ok=True)

    with pool.acquire(pool.pool_devices(gpus)) as slot, \
            telemetry.Sampler(slot.cuda_visible_devices, telemetry_tsv) as sampler:
        started = time.time()
        device, device_name = pick_device(slot, threads)
        resolved = resolve_precision(precision, device)
        log.info("shard %s: %d sequences on %s (%s, slot %s, CUDA_VISIBLE_DEVICES=%r), precision %s",
                 shard, len(rows), device, device_name, slot.index, slot.cuda_visible_devices, resolved)
        progress = Progress(progress_json, shard=shard, gpu_slot=slot.index, device=str(device),
                            device_name=sampler.name or device_name, host=socket.gethostname(),
                            cuda_visible_devices=slot.cuda_visible_devices, gpu_bus_id=sampler.bus_id,
                            started_at=started, n_sequences=len(rows), n_residues=n_residues)
        net, alphabet = esm_model.load(spec)
        layers = absolute_layers(repr_layers, net.num_layers)
        budget = token_budget(toks_per_batch, device, net, resolved)
        embedder = Embedder(net, alphabet, layers, device, resolved, fast_path)
        batch_lengths = [len(sequences[k]) for k in batched]
        batches = make_batches(batch_lengths, budget)
        loaded = time.time()

        tmp = out_h5.with_name(f".{out_h5.name}.tmp")
        try:
            progress.update(0, sampler)
            with h5py.File(tmp, "w") as h5, ThreadPoolExecutor(1) as background:
                writer = ShardWriter(h5, layers, include, net.embed_dim)
                written = []  # one batch's results are written while the next one computes

                def write(done, reps):
                    if written:
                        written.pop().result()
                    written.append(background.submit(writer.write, [indices[k] for k in done],
                                                     [ids[k] for k in done], reps))

                jobs = [[batched[b] for b in batch] for batch in batches]
                results = embedder.embed_batches(((m, [sequences[k] for k in m]) for m in jobs), failed)
                for members, parts in zip(jobs, results):
                    for done, reps in parts:
                        write(done, reps)
                    progress.update(sum(len(sequences[k]) for k in members), sampler)
                for k in chunked:
                    rep = embedder.embed_chunked(k, sequences[k], limit, failed)
                    if rep is not None:
                        write([k], [rep])
                    progress.update(len(sequences[k]), sampler)
                if written:
                    written.pop().result()
                writer.write_failed([(indices[k], reason) for k, reason in failed], dict(zip(indices, ids)))
                h5.attrs.update(
                    shard=shard, n_records=len(rows), model=model, weights=spec.weights, precision=resolved,
                    device=str(device), truncation_seq_length=limit, long_sequences=long_sequences,
                )
            os.replace(tmp, out_h5)
        finally:
            tmp.unlink(missing_ok=True)
            progress.close()
        finished = time.time()

    metrics = {
        "shard": shard,
        "n_sequences": len(rows),
        "n_residues": n_residues,
        "n_failed": len(failed),
        "n_batches": len(batches),
        "toks_per_batch": toks_per_batch,
        "token_budget": budget(batch_lengths[batches[0][0]] + 2) if callable(budget) and batches else budget,
        "padded_fraction": padded_fraction(batch_lengths, batches),
        "seconds": finished - started,
        "load_seconds": loaded - started,
        "compute_seconds": finished - loaded,
        "started_at": started,
        "finished_at": finished,
        "residues_per_second": n_residues / (finished - loaded) if finished > loaded else None,
        "device": str(device),
        "device_name": device_name,
        "gpu_slot": slot.index,
        "cuda_visible_devices": slot.cuda_visible_devices,
        "host": socket.gethostname(),
        "threads": threads,
        "model": model,
        "weights": spec.weights,
        "precision": resolved,
        "fast_path": fast_path,
        "torch_peak_allocated_bytes": torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None,
        **sampler.summary(),
    }
    write_json_atomically(metrics_json, metrics)
    log.info("shard %s done: %d residues in %.1f s, %d failed", shard, n_residues, metrics["seconds"], len(failed))
    done = len(list(metrics_json.parent.glob("*.json")))
    total = len(read_tsv(Path(shard_tsv).parent / "plan.tsv"))
    console(f"shard {done}/{total} done on {device}: {shard}, {rate(metrics['residues_per_second'])} residues/s"
            + (f", {len(failed)} failed" if failed else ""))
    return metrics


def console(message: str) -> None:
    """A line for the run's own output (Snakemake shows a local job's stderr), not just the job log."""
    log.info("%s", message)
    print(message, file=sys.stderr, flush=True)
