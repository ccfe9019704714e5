"""The embed job: one shard's sequences on a pooled device, written into the store with its metrics.

torch (and the model) are loaded only once the job holds its slot of the GPU pool: a job that
waits for a GPU holds no torch (~0.5 GB) and no CUDA context meanwhile.
"""

import functools
import json
import logging
import math
import os
import socket
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

import h5py
import numpy as np

from .. import models
from ..compute import pool, telemetry
from ..compute.batching import make_batches, padded_fraction, token_budget
from ..compute.precision import resolve as resolve_precision
from ..embeddings_h5 import attentions
from ..embeddings_h5.contacts import NAME as CONTACTS
from ..embeddings_h5.representations import absolute_layers
from ..embeddings_h5.scores import MASKED
from ..files import abandon, atomic_path, closable, naming_disk_full, write_json
from ..input.balance import record_costs, record_tokens
from ..input.long_sequences import embedded_residues, skip_reason
from ..layout import Layout
from ..store import Store, add_settings, write_manifest
from ..store.passes import Passes
from ..store.pieces import Kept, Pieces, PieceWriter, assemble
from ..store.runlock import current_run_id
from ..store.shardfile import Failure, output_bytes
from . import provenance
from .job import uninterrupted
from .progress import Progress, forget_stopped, rate, shards_done, stopped_jobs, stopped_path
from .shard import read_shard

log = logging.getLogger(__name__)


def split_records(shard_sequences, limit: int, long_sequences: str):
    """The residues each record is embedded with, and which records go batched, chunked or skipped."""
    sequences, batched, chunked, skipped = [], [], [], []
    for k, sequence in enumerate(shard_sequences):
        length = len(sequence)
        kept = embedded_residues(length, limit, long_sequences)
        if kept == 0:
            skipped.append(Failure(k, skip_reason(length, limit, long_sequences)))
        elif kept > limit:
            chunked.append(k)
        else:
            batched.append(k)
        sequences.append(sequence[:kept])
    return sequences, batched, chunked, skipped


def timed(fn, *args) -> float:
    """Seconds that fn(*args) took."""
    started = time.perf_counter()
    fn(*args)
    return time.perf_counter() - started


class WritingBehind:
    """Each batch's results added to the open piece in a background thread while the next batch
    computes; a piece is kept once the add before it is done."""

    def __init__(self, writer: PieceWriter, background: ThreadPoolExecutor):
        self.writer, self.background = writer, background
        self.pending: list[Future] = []  # the add still going on, if any
        self.write_seconds = self.keep_seconds = 0.0

    def wait(self) -> None:
        # An add leaves the list once done: a signal that lands while this waits leaves it
        # listed, and the handler's keep() waits for it before the piece is closed and counted.
        while self.pending:
            self.write_seconds += self.pending[0].result()
            self.pending.pop(0)

    def add(self, keys, ids, members, reps) -> None:
        self.wait()
        add = self.background.submit(timed, self.writer.add, keys, ids, members, reps)
        self.pending.append(add)

    def keep(self, failed, keys, ids) -> None:
        self.wait()
        with uninterrupted():
            self.keep_seconds += timed(self.writer.keep, failed, keys, ids)

    def discard(self) -> None:
        """Drop the open piece unkept (a full disk), once no add writes into it."""
        for add in self.pending:
            add.exception()
        self.writer.discard()


class RecordProgress:
    """The job's progress, record by record: a record's residues when it is done, or a masked
    pass at a time as its passes go (a residue each), at their share of its cost and forward
    tokens; written at most once a second within a record (a GPU passes a batch in
    milliseconds)."""

    def __init__(self, progress: Progress, sampler, lengths: dict, costs: dict, tokens: dict):
        self.progress, self.sampler, self.lengths = progress, sampler, lengths
        self.per_residue = {
            k: (costs[k] / max(n, 1), tokens[k] / max(n, 1)) for k, n in lengths.items()
        }
        self.reported: dict[int, int] = {}  # the residues each record's passes have counted
        self.pending = np.zeros(3)  # residues, cost, tokens not written yet
        self.written_at = time.monotonic()

    def share(self, index: int, residues: int) -> np.ndarray:
        """Residues of record `index`: (residues, cost, tokens)."""
        return residues * np.array([1.0, *self.per_residue[index]])

    def resumed(self, found: dict[int, int]) -> float:
        """Passes that earlier jobs kept (by record): counted, not this job's work; their cost."""
        self.reported.update(found)
        return sum(self.share(k, n)[1] for k, n in found.items())

    def __call__(self, index: int, n: int) -> None:
        """`n` more passes of record `index` (esmshard.store.passes.Passes hears of them)."""
        self.reported[index] = self.reported.get(index, 0) + n
        self.pending += self.share(index, n)
        if time.monotonic() - self.written_at >= 1:
            self.flush()

    def finished(self, members) -> None:
        """The records `members` are done: what their passes have not counted."""
        for k in members:
            self.pending += self.share(k, self.lengths[k] - self.reported.pop(k, 0))
        self.flush()

    def flush(self) -> None:
        residues, cost, tokens = self.pending
        self.progress.update(round(residues), self.sampler, cost, tokens)
        self.pending[:] = 0
        self.written_at = time.monotonic()


def part_store(out_h5) -> Store:
    """The store that the part `out_h5` goes into (<store>/<settings key>/<part>.h5)."""
    return Store(str(Path(out_h5).parent.parent))


def pick_device(slot: pool.Slot, threads: int):
    """The torch device of the slot, and its name."""
    import torch

    if torch.cuda.is_available():
        device = torch.device("cuda", 0)
        return device, torch.cuda.get_device_name(device)
    if slot.cuda_visible_devices:
        # Where the run's start could tell, it said so once: here, the log. (Its environment had
        # no slot's CUDA_VISIBLE_DEVICES, which the pool has set here: NVML's devices count.)
        told = pool.no_usable_gpu([slot.index], env={}) is not None
        log.log(
            logging.INFO if told else logging.WARNING,
            "slot %s is GPU %s, but this torch cannot use CUDA (a CPU-only build, or no driver): "
            "computing on the CPU",
            slot.index,
            slot.cuda_visible_devices,
        )
    log.info("no CUDA device available: computing on the CPU with %d threads", threads)
    return torch.device("cpu"), "cpu"


def run_shard(
    shard_tsv,
    out_h5,
    manifest_json,
    metrics_json,
    *,
    shard,
    settings: dict,
    toks_per_batch,
    gpus,
    batching="auto",
    compile="auto",
    keep_every=60,
    stopped_keeps="pieces",
    threads,
    progress_json,
    telemetry_tsv,
    outdir,
):
    """Embed one shard's sequences on a pooled device and write its outputs atomically.

    `settings` are the run's embedding settings (esmshard.config.embedding_settings); the shard
    file keeps them for merge to check. What the job finishes is kept in the store every
    `keep_every` seconds (0: only when it is stopped by a signal or an error), as pieces
    (esmshard.store.pieces) that the next job of this shard resumes from. A job stopped where no
    later job runs its shard (`stopped_keeps="part"`: an `esmshard.embed` call, whose shards
    are its own) keeps what it finished as the shard's part instead, holding those sequences
    alone, which any later call or run finds in the store. `out_h5` is a store part
    (esmshard.store): it is renamed into place last, after its manifest and this job's other
    outputs, so that a part that exists is a finished job whatever happens to the run.
    """
    model, repr_layers, include = settings["model"], settings["repr_layers"], settings["include"]
    recipe = settings.get("score_windows", "weighted")  # long proteins' logits
    long_sequences, precision = settings["long_sequences"], settings["precision"]
    limit = settings["truncation_seq_length"]
    keys, ids, shard_sequences = read_shard(shard_tsv)
    sequences, batched, chunked, failed = split_records(shard_sequences, limit, long_sequences)
    del shard_sequences
    n_residues = sum(len(sequences[k]) for k in batched + chunked)
    spec = models.parse_spec(model)
    for path in (out_h5, metrics_json, telemetry_tsv):  # Progress makes its own folder
        Path(path).parent.mkdir(parents=True, exist_ok=True)

    # The part is renamed into place last, once its manifest and the other outputs are written.
    with atomic_path(out_h5) as part:
        with (
            pool.acquire(pool.pool_devices(gpus), job=shard) as slot,
            telemetry.Sampler(slot.cuda_visible_devices, telemetry_tsv) as sampler,
            ExitStack() as on_exit,
        ):
            import torch  # with the slot held (the module's docstring says why)

            from ..compute import compiled
            from ..compute.embedder import Embedder

            torch.set_num_threads(threads)
            started = time.time()
            device, device_name = pick_device(slot, threads)
            resolved = resolve_precision(precision, device)
            log.info(
                "shard %s: %d sequences on %s (%s, slot %s, CUDA_VISIBLE_DEVICES=%r), precision %s",
                shard,
                len(ids),
                device,
                device_name,
                slot.index,
                slot.cuda_visible_devices,
                resolved.name,
            )
            progress = Progress(  # exits with the block below
                progress_json,
                shard=shard,
                gpu_slot=slot.index,
                device=str(device),
                device_name=sampler.name or device_name,
                host=socket.gethostname(),
                pid=os.getpid(),
                cuda_visible_devices=slot.cuda_visible_devices,
                gpu_bus_id=sampler.bus_id,
                started_at=started,
                n_sequences=len(ids),
                n_residues=n_residues,
            )
            net, alphabet = models.load(spec)
            layers = absolute_layers(repr_layers, net.num_layers)
            maps = None  # the attention maps asked for, and their width
            widths = {}
            if attentions.NAME in include:
                maps = attentions.Asked(
                    absolute_layers(settings["attention_layers"], net.num_layers),
                    settings["attention_heads"],
                )
                widths[attentions.NAME] = maps.width(net.attention_heads)
            # contact maps and attention maps: fair-esm's forward pass keeps every layer's
            budget = token_budget(
                toks_per_batch, device, net, resolved, CONTACTS in include or maps is not None
            )
            embedder = Embedder(
                net,
                alphabet,
                layers,
                device,
                resolved,
                settings["fast_path"],
                CONTACTS in include,
                include,
                packed=batching != "padded",
                budget=budget,
                attentions=maps,
                score_windows=recipe,
            )
            # What earlier jobs of this shard kept is not computed again; the rest is batched as
            # an uninterrupted job batches it (whole batches were kept, the longest first).
            pieces = Pieces(part_store(out_h5), Path(out_h5).parent.name, shard)
            kept = pieces.kept()
            todo = [k for k in batched if keys[k] not in kept.keys]
            if kept.paths:
                log.info(
                    "shard %s: %d sequences kept by an earlier job (%d pieces), %d to compute",
                    shard,
                    len(kept.keys),
                    len(kept.paths),
                    len(todo) + sum(keys[k] not in kept.keys for k in chunked),
                )
            batch_lengths = [len(sequences[k]) for k in todo]
            masked = any(kind in MASKED for kind in include)  # a pass per residue
            batches = make_batches(batch_lengths, budget, embedder.packed, masked)
            # the shard step's cost of each record (esmshard.input.balance): the ETA's units,
            # in which a long protein's residues cost more than a short one's
            records = batched + chunked
            lengths = [len(sequences[k]) for k in records]
            costs = record_costs(np.array(lengths), limit, long_sequences, net.embed_dim,
                                 include, recipe)  # fmt: skip
            cost_of = dict(zip(records, costs.tolist()))
            kept_cost = sum(cost_of[k] for k in records if keys[k] in kept.keys)
            total_cost = float(costs.sum())
            # a protein's masked passes: progress as they go, kept within the protein
            tokens = record_tokens(np.array(lengths), limit, long_sequences, include, recipe)
            tokens_of = dict(zip(records, tokens.tolist()))
            record_progress = RecordProgress(
                progress, sampler, dict(zip(records, lengths)), cost_of, tokens_of
            )
            passes = Passes(pieces.folder, keys, keep_every, record_progress)
            embedder.passes = passes
            resumed = passes.resume([k for k in records if keys[k] not in kept.keys], sequences)
            if resumed:
                log.info("shard %s: %s masked passes within %s kept by an earlier job", shard,
                         f"{sum(resumed.values()):,}",
                         f"{len(resumed)} protein{'s' if len(resumed) != 1 else ''}")  # fmt: skip
            kept_cost += record_progress.resumed(resumed)
            layer = None
            eager = compiled.eager_seconds(total_cost - kept_cost, spec.params)
            # compiled where it is on, or where it could be (auto on a GPU) and repays itself
            compilable = embedder.fast and embedder.net.compiles
            if compilable and compiled.wanted(compile, device, math.inf):
                key = compiled.CacheKey.of(
                    device, spec.family.name, embedder.net, resolved.name, embedder.batching
                )
                cache = Path(part_store(out_h5).compiled)
                entry = compiled.Entry.at(cache, key)
                # read (and its bytes hashed) once, and only where auto asks
                cached = functools.cache(lambda: entry.usable(key))
                if compiled.wanted(compile, device, eager, cached):
                    layer = compiled.Compiled(embedder.net, key, cache)
                    layer.start()
                    on_exit.callback(layer.finish)  # the compiler's work kept, its folder removed
                else:
                    log.info(
                        "shard %s: not compiled (compile: auto): its work, about %.0f s on a "
                        "GPU, would save less than compiling takes (%.0f s, %s)",
                        shard,
                        eager,
                        compiled.compile_seconds(cached()),
                        "from the store's compiled code" if cached() else "a first compile",
                    )
            loaded = time.time()
            # earlier jobs' work is done
            progress.computing(kept.residues + sum(resumed.values()), loaded, sampler, kept_cost,
                               total_cost)  # fmt: skip
            # the pieces, then the part made of them
            size = 2 * output_bytes(lengths, len(layers), include, net.embed_dim, widths)
            writer = PieceWriter(
                pieces,
                kept.paths,
                layers,
                include,
                net.embed_dim,
                {"settings": json.dumps(settings)},
                widths,
            )
            index = {key: k for k, key in enumerate(keys)}

            def write_part(paths, failures, n_records):
                """The part of `paths` (pieces) and `failures`, at the temporary path `part`."""
                h5 = h5py.File(part, "w", rdcc_nbytes=0)  # esmshard.files.CLOSE_BYTES
                try:
                    made = assemble(h5, paths, layers, include, net.embed_dim, widths)
                    made.write_failed(failures, keys, ids)
                    h5.attrs.update(
                        shard=shard,
                        n_records=n_records,
                        model=model,
                        model_family=spec.family.name,
                        num_layers=net.num_layers,
                        weights=spec.weights,
                        precision=resolved.name,
                        device=str(device),
                        device_name=sampler.name or device_name,
                        **provenance.software(),
                        truncation_seq_length=limit,
                        long_sequences=long_sequences,
                        settings=json.dumps(settings),
                    )
                    closable(h5, part)
                    h5.close()
                except BaseException:
                    abandon(h5, part)
                    raise

            def stopped_part():
                """What this stopped job and earlier ones finished, put in place as the part."""
                paths = kept.paths + writer.written
                finished = Kept(paths)
                failures = [Failure(index[key], why) for key, _, why in finished.failures]
                write_part(paths, failures, len(finished.keys))
                add_settings(part_store(out_h5), Path(out_h5).parent.name, settings)
                write_manifest(manifest_json, part, len(finished.keys) - len(failures))
                os.replace(part, out_h5)
                pieces.remove()
                log.info("shard %s: stopped; the %d sequences finished are its part in the "
                         "store", shard, len(finished.keys))  # fmt: skip

            with progress, naming_disk_full(out_h5, size), ThreadPoolExecutor(1) as background:
                behind = WritingBehind(writer, background)

                def write(members, done, reps):
                    behind.add([keys[k] for k in done], [ids[k] for k in done], members, reps)

                def keep():
                    behind.keep(failed, keys, ids)

                try:
                    jobs = [[todo[b] for b in batch] for batch in batches]
                    results = embedder.embed_batches(
                        ((m, [sequences[k] for k in m]) for m in jobs), failed
                    )
                    for members, parts in zip(jobs, results):
                        # a batch is kept whole, so that a later job makes the same batches
                        done = [k for indices, _ in parts for k in indices]
                        write(members, done, [r for _, reps in parts for r in reps])
                        record_progress.finished(members)
                        if writer.due(keep_every):
                            keep()
                    for k in chunked:
                        if keys[k] in kept.keys:
                            continue
                        rep = embedder.embed_chunked(k, sequences[k], limit, failed)
                        write([k], [k] if rep is not None else [], [rep] if rep else [])
                        record_progress.finished([k])
                        if writer.due(keep_every):
                            keep()
                    keep()
                except BaseException as err:  # a signal, an error: what is finished is kept
                    if isinstance(err, OSError):  # the disk: the open piece cannot be finished
                        behind.discard()
                        raise
                    try:
                        keep()
                        within = passes.keep()
                        if stopped_keeps == "part" and kept.paths + writer.written:
                            stopped_part()
                        else:
                            log.info("shard %s: %d pieces%s kept for the next job", shard,
                                     len(kept.paths) + len(writer.written),
                                     f" and {within:,} masked passes within proteins"
                                     if within else "")  # fmt: skip
                    except BaseException as failed_keep:  # the error above is the one to say
                        behind.discard()
                        log.warning("shard %s: nothing more kept (%s)", shard, failed_keep)
                    raise
                assembling = time.perf_counter()
                failed += [Failure(index[key], why) for key, _, why in kept.failures]
                write_part(kept.paths + writer.written, failed, len(ids))
                assemble_seconds = time.perf_counter() - assembling
            finished = time.time()

        metrics = {
            "shard": shard,
            "n_sequences": len(ids),
            "n_residues": n_residues,
            "n_failed": len(failed),
            "n_batches": len(batches),
            "toks_per_batch": toks_per_batch,
            "batching": embedder.batching,
            # seconds spent tracing and compiling (0 when not compiled), and whether the
            # compiled code came from the store's cache
            "compile_seconds": layer.seconds if layer else 0.0,
            "compile_cache": ("hit" if layer.hit else "miss") if layer else "off",
            "compile_graphs": layer.graphs if layer else 0,
            "compiled_anew": layer.compiled_anew if layer else 0,
            "token_budget": budget(batch_lengths[batches[0][0]] + 2)
            if callable(budget) and batches
            else budget,
            "padded_fraction": 0.0 if embedder.packed else padded_fraction(batch_lengths, batches),
            "seconds": finished - started,
            "load_seconds": loaded - started,
            "compute_seconds": finished - loaded,
            # the host's own work on the batches: tokens, read-back and checks, then writing
            # (in a thread of its own, beside the next batch)
            "host_seconds": embedder.host_seconds,
            "write_seconds": behind.write_seconds,
            # keeping pieces (closing, hashing, putting in place), and making the part of them
            "keep_seconds": behind.keep_seconds,
            "assemble_seconds": assemble_seconds,
            "started_at": started,
            "finished_at": finished,
            # the jobs of this shard stopped before it: their time, and what they computed
            "stopped_jobs": stopped_jobs(stopped_path(progress_json)),
            # what earlier jobs of this shard kept, and this job did not compute again
            "kept_pieces": len(kept.paths),
            "kept_sequences": len(kept.keys),
            "kept_residues": kept.residues,
            # the same in the shard step's cost units: the ETA's (esmshard.commands.status)
            "cost": total_cost,
            "kept_cost": kept_cost,
            "residues_per_second": (n_residues - kept.residues) / (finished - loaded)
            if finished > loaded
            else None,
            # the tokens of every forward pass this job ran, BOS and EOS included: with masked
            # marginals, each residue's masked copy too (what the device's time went on)
            "forward_tokens": sum(n for k, n in tokens_of.items() if keys[k] not in kept.keys),
            "device": str(device),
            "device_name": device_name,
            "gpu_slot": slot.index,
            "cuda_visible_devices": slot.cuda_visible_devices,
            "host": socket.gethostname(),
            "run_id": current_run_id(Layout(outdir).run_lock),
            "threads": threads,
            "model": model,
            "weights": spec.weights,
            "precision": resolved.name,
            "fast_path": settings["fast_path"],
            "torch_peak_allocated_bytes": torch.cuda.max_memory_allocated(device)
            if device.type == "cuda"
            else None,
            **sampler.summary(),
        }
        write_json(metrics_json, metrics)
        # What the part's settings folder stands for, written anew if it was lost or damaged.
        add_settings(part_store(out_h5), Path(out_h5).parent.name, settings)
        write_manifest(manifest_json, part, len(ids) - len(failed))
    pieces.remove()  # the part holds them now
    forget_stopped(progress_json)  # its metrics hold them now
    log.info(
        "shard %s done: %d residues in %.1f s, %d failed",
        shard,
        n_residues,
        metrics["seconds"],
        len(failed),
    )
    # the plan this shard belongs to: the records' or the mutants' (pseudo_ppl), whose run
    # holds its progress file
    done, total = shards_done(Layout(str(Path(progress_json).parent.parent)), metrics)
    console(
        f"shard {done}/{total} done on {device}: {shard}, {rate(metrics['residues_per_second'])} residues/s"
        + (f", {len(failed)} failed" if failed else "")
    )
    return metrics


def console(message: str) -> None:
    """A line for the run's own output (Snakemake shows a local job's stderr), not just the job log."""
    log.info("%s", message)
    print(message, file=sys.stderr, flush=True)
