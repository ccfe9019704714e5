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
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import h5py
import numpy as np

from .. import models
from ..compute import pool, provenance, telemetry
from ..compute.batching import make_batches, token_budget
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
from ..store.location import Location
from ..store.passes import Passes
from ..store.pieces import Kept, Pieces, PieceWriter, assemble
from ..store.shardfile import Failure, output_bytes
from .embed_metrics import job_metrics
from .progress import Progress, RecordProgress, forget_stopped, rate, shards_done
from .shard import read_shard
from .writing_behind import WritingBehind

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


def part_store(out_h5) -> Store:
    """The store that the part `out_h5` goes into (<store>/<settings key>/<part>.h5)."""
    return Store(str(Path(out_h5).parent.parent))


@dataclass(frozen=True)
class EmbedTask:
    """What one embed job is asked: its shard, its outputs and their options (see run_shard)."""

    shard_tsv: str
    out_h5: str
    manifest_json: str
    metrics_json: str
    progress_json: str
    telemetry_tsv: str
    outdir: str
    shard: str
    settings: dict
    toks_per_batch: object
    gpus: object
    batching: str
    compile: str
    keep_every: float
    stopped_keeps: str
    threads: int
    on_kept: Callable[[], None] | None = None


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
    on_kept=None,
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
    `on_kept` is called after each piece is kept (esmshard.steps.object_store sends it on).
    """
    task = EmbedTask(
        shard_tsv, out_h5, manifest_json, metrics_json, progress_json, telemetry_tsv, outdir,
        shard, settings, toks_per_batch, gpus, batching, compile, keep_every, stopped_keeps,
        threads, on_kept,
    )  # fmt: skip
    return ShardJob(task).run()


class ShardJob:
    """One embed job, phase by phase: the model loaded once the job holds its slot, the work
    that earlier jobs left, the compile decision, the batches embedded and kept, the metrics."""

    def __init__(self, task: EmbedTask):
        self.task = task
        settings = task.settings
        self.limit = settings["truncation_seq_length"]
        self.include = settings["include"]
        self.recipe = settings.get("score_windows", "weighted")  # long proteins' logits
        self.keys, self.ids, shard_sequences = read_shard(task.shard_tsv)
        self.sequences, self.batched, self.chunked, self.failed = split_records(
            shard_sequences, self.limit, settings["long_sequences"]
        )
        self.n_residues = sum(len(self.sequences[k]) for k in self.batched + self.chunked)
        self.index = {key: k for k, key in enumerate(self.keys)}
        self.spec = models.parse_spec(settings["model"])
        self.store = part_store(task.out_h5)
        self.settings_key = Path(task.out_h5).parent.name

    def run(self) -> dict:
        """Run the job's phases and return its metrics."""
        task = self.task
        for path in (task.out_h5, task.metrics_json, task.telemetry_tsv):  # Progress: its own
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        # The part is renamed into place last, once its manifest and the other outputs are written.
        with atomic_path(task.out_h5) as self.part:
            with (
                pool.acquire(pool.pool_devices(task.gpus), job=task.shard) as self.slot,
                telemetry.Sampler(self.slot.cuda_visible_devices, task.telemetry_tsv) as sampler,
                ExitStack() as on_exit,
            ):
                self.sampler = sampler
                self.load()
                self.plan()
                self.layer = self.compiled_layer(on_exit)
                self.loaded = time.time()
                # earlier jobs' work is done
                self.progress.computing(
                    self.kept.residues + sum(self.resumed.values()),
                    self.loaded,
                    sampler,
                    self.kept_cost,
                    self.total_cost,
                )
                self.compute()
                self.finished = time.time()
            metrics = job_metrics(self)
            write_json(task.metrics_json, metrics)
            # What the part's settings folder stands for, written anew if it was lost or damaged.
            add_settings(self.store, self.settings_key, task.settings)
            write_manifest(task.manifest_json, self.part, len(self.ids) - len(self.failed))
        self.pieces.remove()  # the part holds them now
        forget_stopped(task.progress_json)  # its metrics hold them now
        self.announce(metrics)
        return metrics

    def load(self) -> None:
        """Load torch and the model on the slot's device, and build the embedder."""
        import torch  # with the slot held (the module's docstring says why)

        from ..compute.embedder import Embedder

        task, settings = self.task, self.task.settings
        torch.set_num_threads(task.threads)
        self.started = time.time()
        self.device, self.device_name = pool.pick_device(self.slot, task.threads)
        self.precision = resolve_precision(settings["precision"], self.device)
        log.info(
            "shard %s: %d sequences on %s (%s, slot %s, CUDA_VISIBLE_DEVICES=%r), precision %s",
            task.shard,
            len(self.ids),
            self.device,
            self.device_name,
            self.slot.index,
            self.slot.cuda_visible_devices,
            self.precision.name,
        )
        self.progress = Progress(  # exits with compute()
            task.progress_json,
            sent_as=Layout(task.outdir).progress(task.shard),
            shard=task.shard,
            gpu_slot=self.slot.index,
            device=str(self.device),
            device_name=self.sampler.name or self.device_name,
            host=socket.gethostname(),
            pid=os.getpid(),
            cuda_visible_devices=self.slot.cuda_visible_devices,
            gpu_bus_id=self.sampler.bus_id,
            started_at=self.started,
            n_sequences=len(self.ids),
            n_residues=self.n_residues,
        )
        self.net, alphabet = models.load(self.spec)
        self.layers = absolute_layers(settings["repr_layers"], self.net.num_layers)
        maps = None  # the attention maps asked for, and their width
        self.widths = {}
        if attentions.NAME in self.include:
            maps = attentions.Asked(
                absolute_layers(settings["attention_layers"], self.net.num_layers),
                settings["attention_heads"],
            )
            self.widths[attentions.NAME] = maps.width(self.net.attention_heads)
        # Contact maps and attention maps need every layer's attention weights held at once:
        # the budget leaves room for them.
        contacts = CONTACTS in self.include
        self.budget = token_budget(
            task.toks_per_batch,
            self.device,
            self.net,
            self.precision,
            contacts or maps is not None,
        )
        self.embedder = Embedder(
            self.net, alphabet, self.layers, self.device, self.precision, settings["fast_path"],
            contacts, self.include, packed=task.batching != "padded", budget=self.budget,
            attentions=maps, score_windows=self.recipe,
        )  # fmt: skip

    def plan(self) -> None:
        """Find what earlier jobs of this shard kept, batch the rest, and cost each record."""
        keys, long_sequences = self.keys, self.task.settings["long_sequences"]
        # What earlier jobs of this shard kept is not computed again; the rest is batched as
        # an uninterrupted job batches it (whole batches were kept, the longest first).
        self.pieces = Pieces(self.store, self.settings_key, self.task.shard, self.task.on_kept)
        kept = self.kept = self.pieces.kept()
        self.todo = [k for k in self.batched if keys[k] not in kept.keys]
        if kept.paths:
            log.info(
                "shard %s: %d sequences kept by an earlier job (%d pieces), %d to compute",
                self.task.shard,
                len(kept.keys),
                len(kept.paths),
                len(self.todo) + sum(keys[k] not in kept.keys for k in self.chunked),
            )
        self.batch_lengths = [len(self.sequences[k]) for k in self.todo]
        masked = any(kind in MASKED for kind in self.include)  # a pass per residue
        self.batches = make_batches(self.batch_lengths, self.budget, self.embedder.packed, masked)
        # the shard step's cost of each record (esmshard.input.balance): the ETA's units,
        # in which a long protein's residues cost more than a short one's
        records = self.batched + self.chunked
        self.lengths = [len(self.sequences[k]) for k in records]
        lengths = np.array(self.lengths)
        costs = record_costs(lengths, self.limit, long_sequences, self.net.embed_dim,
                             self.include, self.recipe)  # fmt: skip
        cost_of = dict(zip(records, costs.tolist()))
        self.kept_cost = sum(cost_of[k] for k in records if keys[k] in kept.keys)
        self.total_cost = float(costs.sum())
        # a protein's masked passes: progress as they go, kept within the protein
        tokens = record_tokens(lengths, self.limit, long_sequences, self.include, self.recipe)
        self.tokens_of = dict(zip(records, tokens.tolist()))
        self.record_progress = RecordProgress(
            self.progress, self.sampler, dict(zip(records, self.lengths)), cost_of, self.tokens_of
        )
        self.passes = Passes(self.pieces.folder, keys, self.task.keep_every, self.record_progress)
        self.embedder.passes = self.passes
        self.resumed = self.passes.resume([k for k in records if keys[k] not in kept.keys],
                                          self.sequences)  # fmt: skip
        if self.resumed:
            log.info("shard %s: %s masked passes within %s kept by an earlier job",
                     self.task.shard, f"{sum(self.resumed.values()):,}",
                     f"{len(self.resumed)} protein{'s' if len(self.resumed) != 1 else ''}")  # fmt: skip
        self.kept_cost += self.record_progress.resumed(self.resumed)

    def compiled_layer(self, on_exit: ExitStack):
        """Start the compiled model where compile is on, or where it could be (auto on a GPU)
        and repays itself; None where the job runs eager."""
        from ..compute import compiled

        embedder, device, compile = self.embedder, self.device, self.task.compile
        eager = compiled.eager_seconds(self.total_cost - self.kept_cost, self.spec.params)
        compilable = embedder.fast and embedder.net.compiles
        if not (compilable and compiled.wanted(compile, device, math.inf)):
            return None
        key = compiled.CacheKey.of(
            device, self.spec.family.name, embedder.net, self.precision.name, embedder.batching
        )
        cache = Path(self.store.compiled)
        entry = compiled.Entry.at(cache, key)
        # read (and its bytes hashed) once, and only where auto asks
        cached = functools.cache(lambda: entry.usable(key))
        if not compiled.wanted(compile, device, eager, cached):
            log.info(
                "shard %s: not compiled (compile: auto): its work, about %.0f s on a "
                "GPU, would save less than compiling takes (%.0f s, %s)",
                self.task.shard,
                eager,
                compiled.compile_seconds(cached()),
                "from the store's compiled code" if cached() else "a first compile",
            )
            return None
        layer = compiled.Compiled(embedder.net, key, cache)
        layer.start()
        on_exit.callback(layer.finish)  # the compiler's work kept, its folder removed
        return layer

    def compute(self) -> None:
        """Embed what is left in pieces, then make the shard's part of every piece."""
        include, dim = self.include, self.net.embed_dim
        size = 2 * output_bytes(self.lengths, len(self.layers), include, dim, self.widths)
        # the pieces, then the part made of them
        self.writer = PieceWriter(
            self.pieces, self.kept.paths, self.layers, include, dim,
            {"settings": json.dumps(self.task.settings)}, self.widths,
        )  # fmt: skip
        progress, on_disk = self.progress, naming_disk_full(self.task.out_h5, size)
        with progress, on_disk, ThreadPoolExecutor(1) as background:
            self.behind = WritingBehind(self.writer, background)
            try:
                self.embed_records()
            except BaseException as err:  # a signal, an error: what is finished is kept
                self.keep_stopped(err)
                raise
            assembling = time.perf_counter()
            self.failed += [Failure(self.index[key], why) for key, _, why in self.kept.failures]
            self.write_part(self.kept.paths + self.writer.written, self.failed, len(self.ids))
            self.assemble_seconds = time.perf_counter() - assembling

    def embed_records(self) -> None:
        """Embed the batched records, then the chunked ones, and keep the last piece."""
        jobs = [[self.todo[b] for b in batch] for batch in self.batches]
        results = self.embedder.embed_batches(
            ((m, [self.sequences[k] for k in m]) for m in jobs), self.failed
        )
        for members, parts in zip(jobs, results):
            # a batch is kept whole, so that a later job makes the same batches
            done = [k for indices, _ in parts for k in indices]
            self.write(members, done, [r for _, reps in parts for r in reps])
        for k in self.chunked:
            if self.keys[k] in self.kept.keys:
                continue
            rep = self.embedder.embed_chunked(k, self.sequences[k], self.limit, self.failed)
            self.write([k], [k] if rep is not None else [], [rep] if rep else [])
        self.keep()

    def write(self, members, done, reps) -> None:
        """Add a batch's results to the open piece, and keep the piece where one is due."""
        self.behind.add([self.keys[k] for k in done], [self.ids[k] for k in done], members, reps)
        self.record_progress.finished(members)
        if self.writer.due(self.task.keep_every):
            self.keep()

    def keep(self) -> None:
        """Keep the open piece."""
        self.behind.keep(self.failed, self.keys, self.ids)

    def keep_stopped(self, err: BaseException) -> None:
        """Keep what a stopped job finished, for the next job or as the shard's part."""
        if isinstance(err, OSError):  # the disk: the open piece cannot be finished
            self.behind.discard()
            return
        try:
            self.keep()
            within = self.passes.keep()
            if self.task.stopped_keeps == "part" and self.kept.paths + self.writer.written:
                self.stopped_part()
            else:
                log.info("shard %s: %d pieces%s kept for the next job", self.task.shard,
                         len(self.kept.paths) + len(self.writer.written),
                         f" and {within:,} masked passes within proteins"
                         if within else "")  # fmt: skip
        except BaseException as failed_keep:  # the error the caller raises is the one to say
            self.behind.discard()
            log.warning("shard %s: nothing more kept (%s)", self.task.shard, failed_keep)

    def write_part(self, paths, failures, n_records) -> None:
        """Write the part of `paths` (pieces) and `failures` at the temporary path."""
        settings, part = self.task.settings, self.part
        h5 = h5py.File(part, "w", rdcc_nbytes=0)  # esmshard.files.CLOSE_BYTES
        try:
            made = assemble(h5, paths, self.layers, self.include, self.net.embed_dim, self.widths)
            made.write_failed(failures, self.keys, self.ids)
            h5.attrs.update(
                shard=self.task.shard,
                n_records=n_records,
                model=settings["model"],
                model_family=self.spec.family.name,
                num_layers=self.net.num_layers,
                weights=self.spec.weights,
                precision=self.precision.name,
                device=str(self.device),
                device_name=self.sampler.name or self.device_name,
                **provenance.software(),
                truncation_seq_length=self.limit,
                long_sequences=settings["long_sequences"],
                settings=json.dumps(settings),
            )
            closable(h5, part)
            h5.close()
        except BaseException:
            abandon(h5, part)
            raise

    def stopped_part(self) -> None:
        """Put what this stopped job and earlier ones finished in place as the part."""
        task = self.task
        paths = self.kept.paths + self.writer.written
        finished = Kept(paths)
        failures = [Failure(self.index[key], why) for key, _, why in finished.failures]
        self.write_part(paths, failures, len(finished.keys))
        add_settings(self.store, self.settings_key, task.settings)
        write_manifest(task.manifest_json, self.part, len(finished.keys) - len(failures))
        os.replace(self.part, task.out_h5)
        self.pieces.remove()
        log.info("shard %s: stopped; the %d sequences finished are its part in the "
                 "store", task.shard, len(finished.keys))  # fmt: skip

    def announce(self, metrics: dict) -> None:
        """Log the job's end, and say it in the run's own output."""
        shard, n_failed = self.task.shard, len(self.failed)
        log.info(
            "shard %s done: %d residues in %.1f s, %d failed",
            shard,
            self.n_residues,
            metrics["seconds"],
            n_failed,
        )
        # the plan this shard belongs to: the records' or the mutants' (pseudo_ppl), whose run
        # holds its progress file
        layout = Layout(str(Path(self.task.progress_json).parent.parent))
        place = ""
        if not Location.of_job().in_objects:  # jobs that share no filesystem see no other's
            place = "{}/{} ".format(*shards_done(layout, metrics))
        console(
            f"shard {place}done on {self.device}: {shard}, "
            f"{rate(metrics['residues_per_second'])} residues/s"
            + (f", {n_failed} failed" if n_failed else "")
        )


def console(message: str) -> None:
    """A line for the run's own output (Snakemake shows a local job's stderr), not just the job log."""
    log.info("%s", message)
    print(message, file=sys.stderr, flush=True)
