"""Embedding one shard: batching, the forward pass, and the shard's output files."""
import json
import logging
import os
import socket
import time
from pathlib import Path

import h5py
import numpy as np
import torch

from . import model as esm_model
from . import pool
from .shard import chunk_spans, embedded_residues, read_tsv

log = logging.getLogger(__name__)

INCLUDE_KINDS = ("mean", "per_tok", "bos")
# Test hook: batches of more tokens than this raise an out-of-memory error, as CUDA would.
INJECT_OOM_ENV = "ESMSHARD_INJECT_OOM_TOKENS"
STR_DTYPE = h5py.string_dtype("utf-8")


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


def make_batches(lengths, toks_per_batch: int) -> list[list[int]]:
    """Longest first, each batch as many sequences as fit the token budget once padded.

    A sequence longer than the budget gets a batch of its own.
    """
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    batches, current, width = [], [], 0
    for i in order:
        tokens = lengths[i] + 2  # BOS and EOS
        width = max(width, tokens)
        if current and width * (len(current) + 1) > toks_per_batch:
            batches.append(current)
            current, width = [], tokens
        current.append(i)
    if current:
        batches.append(current)
    return batches


class Embedder:
    """fair-esm's ESM-2 forward pass with fair-esm's token layout, on one device."""

    def __init__(self, model, alphabet, layers, include, device, precision):
        self.model = model.to(device)
        self.alphabet = alphabet
        self.layers = layers
        self.include = include
        self.device = device
        self.precision = precision
        self.inject_oom_tokens = int(os.environ.get(INJECT_OOM_ENV, 0)) or None

    def tokens(self, sequences: list[str]) -> torch.Tensor:
        width = max(len(s) for s in sequences) + 2
        toks = torch.full((len(sequences), width), self.alphabet.padding_idx, dtype=torch.int64)
        for row, seq in enumerate(sequences):
            toks[row, 0] = self.alphabet.cls_idx
            toks[row, 1:len(seq) + 1] = torch.tensor(self.alphabet.encode(seq), dtype=torch.int64)
            toks[row, len(seq) + 1] = self.alphabet.eos_idx
        return toks

    def forward(self, sequences: list[str]) -> list[dict]:
        """Per sequence, {layer: (per-residue array, BOS array)}, float32 on the CPU."""
        toks = self.tokens(sequences)
        if self.inject_oom_tokens and toks.numel() > self.inject_oom_tokens:
            raise torch.OutOfMemoryError(f"injected: batch of {toks.numel()} tokens")
        dtype = AUTOCAST_DTYPES.get(self.precision)
        with torch.inference_mode(), torch.autocast(self.device.type, dtype=dtype, enabled=dtype is not None):
            out = self.model(toks.to(self.device, non_blocking=True), repr_layers=self.layers)
        reps = {layer: rep.float().cpu().numpy() for layer, rep in out["representations"].items()}
        return [
            {layer: (rep[row, 1:len(seq) + 1], rep[row, 0]) for layer, rep in reps.items()}
            for row, seq in enumerate(sequences)
        ]

    def embed(self, indices: list[int], sequences: list[str], failed: list):
        """Yield (indices, representations) for the batch, halving it on out-of-memory.

        A sequence that fails on its own is appended to `failed` as (index, reason).
        """
        try:
            reps = self.forward(sequences)
        except torch.OutOfMemoryError as err:
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
            if len(sequences) == 1:
                failed.append((indices[0], f"out of memory even alone ({len(sequences[0])} residues): {err}"))
                return
            half = len(sequences) // 2
            log.warning("out of memory on a batch of %d sequences; retrying as two halves", len(sequences))
            yield from self.embed(indices[:half], sequences[:half], failed)
            yield from self.embed(indices[half:], sequences[half:], failed)
            return
        kept = []
        for index, rep in zip(indices, reps):
            if all(np.isfinite(per_tok).all() and np.isfinite(bos).all() for per_tok, bos in rep.values()):
                kept.append((index, rep))
            else:
                failed.append((index, "non-finite values in the representations"))
        if kept:
            yield [i for i, _ in kept], [r for _, r in kept]

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


def run_shard(shard_tsv, out_h5, metrics_json, *, shard, model, repr_layers, include, toks_per_batch,
              truncation_seq_length, long_sequences, precision, gpus, threads):
    """Embed one shard's sequences on a pooled device and write its outputs atomically."""
    out_h5, metrics_json = Path(out_h5), Path(metrics_json)
    rows = read_tsv(shard_tsv)
    indices = [int(r["index"]) for r in rows]
    ids = [r["id"] for r in rows]
    limit = truncation_seq_length
    failed, chunked, batched, sequences = [], [], [], []
    for k, r in enumerate(rows):
        kept = embedded_residues(len(r["sequence"]), limit, long_sequences)
        if kept == 0:
            failed.append((k, f"longer than truncation_seq_length ({len(r['sequence'])} > {limit} residues); "
                              f"skipped (long_sequences: {long_sequences})"))
        elif kept > limit:
            chunked.append(k)
        else:
            batched.append(k)
        sequences.append(r["sequence"][:kept])
    spec = esm_model.parse_spec(model)
    torch.set_num_threads(threads)

    with pool.acquire(pool.pool_devices(gpus)) as slot:
        started = time.time()
        if torch.cuda.is_available():
            device = torch.device("cuda", 0)
            device_name = torch.cuda.get_device_name(device)
        else:
            if slot.cuda_visible_devices:
                log.warning("slot %s names GPU %s, but torch cannot use CUDA here", slot.index, slot.cuda_visible_devices)
            log.info("no CUDA device available: computing on the CPU with %d threads", threads)
            device, device_name = torch.device("cpu"), "cpu"
        resolved = resolve_precision(precision, device)
        log.info("shard %s: %d sequences on %s (%s, slot %s, CUDA_VISIBLE_DEVICES=%r), precision %s",
                 shard, len(rows), device, device_name, slot.index, slot.cuda_visible_devices, resolved)
        net, alphabet = esm_model.load(spec)
        layers = absolute_layers(repr_layers, net.num_layers)
        embedder = Embedder(net, alphabet, layers, include, device, resolved)
        loaded = time.time()

        tmp = out_h5.with_name(f".{out_h5.name}.tmp")
        batches = make_batches([len(sequences[k]) for k in batched], toks_per_batch)
        try:
            with h5py.File(tmp, "w") as h5:
                writer = ShardWriter(h5, layers, include, net.embed_dim)
                for batch in batches:
                    members = [batched[b] for b in batch]
                    for done, reps in embedder.embed(members, [sequences[k] for k in members], failed):
                        writer.write([indices[k] for k in done], [ids[k] for k in done], reps)
                for k in chunked:
                    rep = embedder.embed_chunked(k, sequences[k], limit, failed)
                    if rep is not None:
                        writer.write([indices[k]], [ids[k]], [rep])
                writer.write_failed([(indices[k], reason) for k, reason in failed], dict(zip(indices, ids)))
                h5.attrs.update(
                    shard=shard, n_records=len(rows), model=model, weights=spec.weights, precision=resolved,
                    device=str(device), truncation_seq_length=limit, long_sequences=long_sequences,
                )
            os.replace(tmp, out_h5)
        finally:
            tmp.unlink(missing_ok=True)
        finished = time.time()

    n_residues = sum(len(sequences[k]) for k in batched + chunked)
    metrics = {
        "shard": shard,
        "n_sequences": len(rows),
        "n_residues": n_residues,
        "n_failed": len(failed),
        "n_batches": len(batches),
        "toks_per_batch": toks_per_batch,
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
    }
    write_json_atomically(metrics_json, metrics)
    log.info("shard %s done: %d residues in %.1f s (%.0f residues/s), %d failed",
             shard, n_residues, metrics["seconds"], n_residues / max(metrics["seconds"], 1e-9), len(failed))
    return metrics
