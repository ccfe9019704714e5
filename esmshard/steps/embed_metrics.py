"""An embed job's metrics (metrics/<shard>.json): its work, its time, what it kept and where it
ran, read by the scaling report and `esmshard status`.
"""

import socket

from ..compute.batching import padded_fraction
from ..layout import Layout
from ..store.runlock import current_run_id
from .progress import stopped_jobs, stopped_path


def job_metrics(job) -> dict:
    """The metrics of a finished embed job (esmshard.steps.embed.ShardJob): its work, its time,
    what it kept and where it ran."""
    task, layer, kept = job.task, job.layer, job.kept
    budget, batches, lengths = job.budget, job.batches, job.batch_lengths
    return {
        "shard": task.shard,
        "n_sequences": len(job.ids),
        "n_residues": job.n_residues,
        "n_failed": len(job.failed),
        "n_batches": len(batches),
        "toks_per_batch": task.toks_per_batch,
        "batching": job.embedder.batching,
        # seconds spent tracing and compiling (0 when not compiled), and whether the
        # compiled code came from the store's cache
        "compile_seconds": layer.seconds if layer else 0.0,
        "compile_cache": ("hit" if layer.hit else "miss") if layer else "off",
        "compile_graphs": layer.graphs if layer else 0,
        "compiled_anew": layer.compiled_anew if layer else 0,
        "token_budget": budget(lengths[batches[0][0]] + 2)
        if callable(budget) and batches
        else budget,
        "padded_fraction": 0.0 if job.embedder.packed else padded_fraction(lengths, batches),
        **timings(job),
        # the jobs of this shard stopped before it: their time, and what they computed
        "stopped_jobs": stopped_jobs(stopped_path(task.progress_json)),
        # what earlier jobs of this shard kept, and this job did not compute again
        "kept_pieces": len(kept.paths),
        "kept_sequences": len(kept.keys),
        "kept_residues": kept.residues,
        # the same in the shard step's cost units: the ETA's (esmshard.commands.status)
        "cost": job.total_cost,
        "kept_cost": job.kept_cost,
        "residues_per_second": (job.n_residues - kept.residues) / (job.finished - job.loaded)
        if job.finished > job.loaded
        else None,
        # the tokens of every forward pass this job ran, BOS and EOS included: with masked
        # marginals, each residue's masked copy too (what the device's time went on)
        "forward_tokens": sum(n for k, n in job.tokens_of.items() if job.keys[k] not in kept.keys),
        **where(job),
    }


def timings(job) -> dict:
    """Where the job's seconds went."""
    started, loaded, finished = job.started, job.loaded, job.finished
    return {
        "seconds": finished - started,
        "load_seconds": loaded - started,
        "compute_seconds": finished - loaded,
        # the host's own work on the batches: tokens, read-back and checks, then writing
        # (in a thread of its own, beside the next batch)
        "host_seconds": job.embedder.host_seconds,
        "write_seconds": job.behind.write_seconds,
        # keeping pieces (closing, hashing, putting in place), and making the part of them
        "keep_seconds": job.behind.keep_seconds,
        "assemble_seconds": job.assemble_seconds,
        "started_at": started,
        "finished_at": finished,
    }


def where(job) -> dict:
    """Where the job ran, and with what model and settings."""
    import torch

    settings, device = job.task.settings, job.device
    return {
        "device": str(device),
        "device_name": job.device_name,
        "gpu_slot": job.slot.index,
        "cuda_visible_devices": job.slot.cuda_visible_devices,
        "host": socket.gethostname(),
        "run_id": current_run_id(Layout(job.task.outdir).run_lock),
        "threads": job.task.threads,
        "model": settings["model"],
        "weights": job.spec.weights,
        "precision": job.precision.name,
        "fast_path": settings["fast_path"],
        "torch_peak_allocated_bytes": torch.cuda.max_memory_allocated(device)
        if device.type == "cuda"
        else None,
        **job.sampler.summary(),
    }
