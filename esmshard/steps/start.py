"""What a `snakemake` command of a run does around its jobs, decided once while Snakemake reads
the workflow (workflow/rules/common.smk makes one RunStart and calls `begin`, then
`hold_run_lock` as the jobs start and `summary` after the last): refuse a run where another is
active in the outdir, repair values in place whose store parts changed, plan anew where the
plan is damaged, say what is replaced, what the mutants' run computes and that no GPU can be
used (refusing a model too large for this machine where its jobs would compute on its CPU),
refuse a cluster profile's placeholders; and how many shard processes and embed jobs at once.

What the command is: esmshard.steps.invocation.
"""

import atexit
import json
import os
import posixpath
import re
import shlex
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from ..compute.pool import no_usable_gpu, pool_devices, visible_devices
from ..compute.provenance import mixed_precisions
from ..files import read_tsv
from ..input.sizing import (
    CPU_FLOPS,
    DEVICE_KINDS,
    compute_seconds,
    cpu_memory_problem,
    host_memory_bytes,
)
from ..input.variants import MUTANT_KINDS, PSEUDO_PPL, mutants_work
from ..layout import Layout
from ..outputs.variant_writer import counts_line, read_counts
from ..store import Store, in_place_problems, read_json_object
from ..store.lease import Lease
from ..store.leftovers import remove_leftovers
from ..store.location import Location
from ..store.runlock import TYPED_COMMAND_ENV, active_run_problem, current_run_id, hold, run_active
from ..store.storelock import hold_shared
from .invocation import (
    CLUSTER_JOBS_ENV,
    PLACEHOLDER,
    Invocation,
    StartRefused,
    placeholder_advice,
)
from .object_run import read_run_json, run_bucket
from .progress import METRICS_FIELDS, busy_seconds, computing_span, current_files, duration, rate
from .run_state import read_state
from .shard import plan_problem

# What Snakemake's log says of a run that a signal stopped (Ctrl-C; SIGTERM to a job).
STOPPED = re.compile(
    r"Terminating processes on user request|died with <Signals\.SIG(INT|TERM|HUP)"
    r"|returned non-zero exit status (129|130|143)\."  # a job stopped by SIGHUP, SIGINT, SIGTERM
)
EMBED_THREADS = 2  # each embed job's CPU threads (torch's, where it computes on the CPU)
# The shard step's reading processes at most, unless --set-threads says more: each holds about
# 400 MB (esmshard.input.scan).
SHARD_THREADS = 8


class Log(Protocol):
    def info(self, message: str) -> None: ...

    def warning(self, message: str) -> None: ...


@dataclass
class RunStart:
    """One command of a run, as its start needs it: what the command is (`invocation`), the
    checked `config`, the outdir's layout (`run`), the `store`, the settings keys of the
    records (`key`) and of the mutants' run (`mutant_key`, None without one), the model's name
    and parameters, what made the outdir's embeddings.h5 (`earlier`), and where lines go."""

    invocation: Invocation
    config: dict
    run: Layout
    store: Store
    key: str
    mutant_key: str | None
    model_name: str
    model_params: int
    earlier: dict | None
    log: Log
    store_unwritable: str | None = None
    location: Location = Location()  # in object storage: no lock to take

    @property
    def cores(self) -> int:
        """Snakemake's --cores (1 where none is given: it asks for them before any job)."""
        return self.invocation.cores or 1

    def begin(self) -> None:
        """Everything a command does before the jobs are planned; raises StartRefused."""
        self.refuse_placeholders()
        self.refuse_an_active_run()
        self.repair_in_place()
        self.replan_damaged()
        self.say_what_is_replaced()
        self.say_pseudo_ppl_work()
        self.say_no_usable_gpu()
        self.say_what_is_kept()

    def refuse_placeholders(self) -> None:
        """A cluster profile's resources still holding PLACEHOLDER: refused before anything is
        submitted; a dry run, which submits nothing, says so and plans, but for a placeholder
        bucket, where there is nothing to plan from."""
        found = self.invocation.placeholders
        if not found or self.invocation.jobs_here or self.invocation.lint:
            return
        problem = (
            f"the profile still holds placeholders ({', '.join(found)}): "
            f"{placeholder_advice(self.invocation.profiles)} (docs/clusters.md)"
        )
        bucket = PLACEHOLDER in (self.location.prefix or "")
        if self.invocation.dry_run and not bucket:
            self.log.warning(f"esmshard: {problem} before a run submits jobs")
        elif not self.invocation.remote_job:
            raise StartRefused(f"{problem}; nothing was submitted")

    def refuse_an_active_run(self) -> None:
        """One line before the DAG where another run holds this outdir (`hold_run_lock` takes the
        lock; two runs started at the same moment are told apart there)."""
        if not self.invocation.starts_run:
            return
        problem = active_run_problem(self.run.run_lock, self.config["outdir"], self.log.info)
        if self.location.in_objects and not problem:
            problem = self.lease().problem()
        if problem:
            raise StartRefused(problem)

    def repair_in_place(self) -> None:
        """An in-place embeddings.h5 whose store parts are gone or changed is removed with its
        plan, so that this run computes what the store lacks and writes it anew (the repair its
        readers advise, esmshard.embeddings_h5.in_place.REPAIR). Only where this command runs the
        jobs, and no other run is active in the outdir (its own start says so)."""
        if not self.invocation.starts_run or (self.earlier or {}).get("settings_key") != self.key:
            return  # no output, or another's: this run replaces it (say_what_is_replaced)
        problems = in_place_problems(self.run.embeddings, self.run.checksums)
        if not problems or run_active(self.run.run_lock):
            return
        os.remove(self.run.embeddings)
        shutil.rmtree(self.run.shard_dir, ignore_errors=True)
        more = f" and {len(problems) - 1} more" if len(problems) > 1 else ""
        self.log.warning(
            f"esmshard: {self.run.embeddings} read its values in place from store parts that "
            f"are gone or changed ({problems[0]}{more}): removed it and its plan; the sequences "
            "the store lacks are computed again"
        )

    def replan_damaged(self) -> None:
        """A plan that is damaged (its files cut short, replaced or gone: esmshard.steps.shard.
        plan_problem) is removed with the embeddings.h5 merged from it, so that this run plans
        anew and merges again (Snakemake reruns no shard step whose outputs exist): the store
        keeps what was computed. Only where this command runs the jobs and no other run is
        active."""
        run = self.run
        if not self.invocation.starts_run or not os.path.isdir(run.shard_dir):
            return
        if run_active(run.run_lock):
            return
        # The shard step writes its folder whole (atomically): one without any of its plan
        # files is not esmshard's to remove.
        if not any(os.path.lexists(path) for path in (run.plan, run.plan_json, run.records)):
            return
        problem = plan_problem(run)
        if problem:
            shutil.rmtree(run.shard_dir)
            if os.path.isfile(run.embeddings):
                os.remove(run.embeddings)
            self.log.warning(
                f"esmshard: {run.shard_dir}: {problem}: planned anew and merged again (the "
                "store keeps what was computed)"
            )

    def say_what_is_replaced(self) -> None:
        """One line where the outdir holds results of other settings (another model, other
        layers): this run writes its own over them once it finishes (a run that fails before,
        offline without its weights, replaces nothing); their numbers stay in the store."""
        earlier = self.earlier
        if not self.invocation.starts_run or not earlier:
            return
        if earlier.get("settings_key") not in (None, self.key):
            self.log.warning(
                f"esmshard: {self.run.embeddings} holds {earlier.get('model')}'s embeddings of "
                f"other settings (key {earlier.get('settings_key')}): once it finishes, this run "
                f"replaces it with {self.config['model']}'s (key {self.key}); the earlier "
                "numbers stay in the store (`esmshard store` lists them)"
            )

    def say_pseudo_ppl_work(self) -> None:
        """One line before any job (a dry run's too): what the mutants' run computes."""
        config = self.config
        if self.mutant_key is None or self.invocation.remote_job or self.invocation.lint:
            return
        strategies = [s for s in config["variant_scoring"] if s in MUTANT_KINDS]
        work = mutants_work(config["input"], config["variants"], self.scored_limit,
                            config["variant_offset"], strategies,
                            config["truncation_seq_length"])  # fmt: skip
        each = (
            "one per residue of each, and one unmasked"
            if PSEUDO_PPL in strategies
            else "one each, unmasked"
        )
        seconds, basis = self.mutants_seconds(work.tokens)
        self.log.info(
            f"esmshard: {', '.join(strategies)}: {work.sequences:,} mutant sequences, "
            f"{work.passes:,} forward passes ({each}), embedded in {self.run.mutants.outdir}: "
            f"about {duration(seconds)} of one device's time ({basis})"
        )

    def mutants_seconds(self, tokens: int) -> tuple[float, str]:
        """The time of the mutants' run's passes (`tokens`) on one device, and its basis: the
        tokens/s that this run's embed jobs measured, else a rate assumed for the device they
        compute on."""
        planned = (read_json_object(Path(self.run.plan_json)) or {}).get("key") == self.key
        metrics = []
        if planned and Path(self.run.plan).is_file():  # a plan of this run's settings
            plan = read_tsv(self.run.plan)
            metrics = current_files(self.run, self.run.metrics, plan, METRICS_FIELDS)
        ran = busy_seconds(computing_span(m, m["finished_at"]) for m in metrics)
        measured = sum(m.get("forward_tokens", 0) for m in metrics) / ran if ran > 0 else 0
        if measured > 0:
            return tokens / measured, f"at {rate(measured)} tokens/s, as this run's jobs measured"
        on_gpu = self.on_cluster or (
            visible_devices() and no_usable_gpu(self.config["gpus"]) is None
        )
        flops, device = (DEVICE_KINDS[1].flops, "an H100") if on_gpu else (CPU_FLOPS, "a CPU")
        return compute_seconds(tokens, self.model_params, flops), f"assumed: {device}'s rate"

    @property
    def scored_limit(self) -> int | None:
        from ..input.long_sequences import scored_limit

        return scored_limit(self.config["truncation_seq_length"], self.config["long_sequences"])

    def say_no_usable_gpu(self) -> None:
        """One line, before any job, where the GPUs asked for cannot be used: the embed jobs
        compute on the CPU, and the cores, not the pool's slots, set how many run at once. A
        model whose embed job needs more memory than the machine has is refused there (the 6B
        ESM C, the 15B ESM-2 on a workstation without GPUs). Only where this command runs the
        jobs on this machine: a dry run, `--lint` and a cluster's executor plan them all."""
        invocation = self.invocation
        if not invocation.starts_run or not invocation.jobs_here:
            return
        gpus = self.config["gpus"]
        why = no_usable_gpu(gpus)
        # None also where `gpus: auto` finds no GPU, a CPU run as asked: told apart without
        # asking NVML again where GPUs were listed
        if why is None and (gpus != "auto" or visible_devices()):
            return
        too_large = cpu_memory_problem(self.model_name, self.model_params, host_memory_bytes())
        if too_large:
            raise StartRefused(too_large)
        if why is None:  # gpus: auto, and no GPU: a CPU run, as asked
            return
        at_once = max(1, min(self.parallel_jobs(), self.cores // EMBED_THREADS))
        self.log.warning(
            f"esmshard: gpus {gpus}, but {why}: the embed jobs compute on the CPU instead, "
            f"{EMBED_THREADS} threads each, "
            + ("one after another" if at_once == 1 else f"{at_once} at a time")
            + f" on {self.cores} cores"
        )

    def parallel_jobs(self) -> int:
        """The embed jobs that run at once, for `shards: auto`: on one machine the GPU pool's
        slots, at most `--resources gpu`; with a cluster's executor, the jobs
        Snakemake may have queued or running at once (`--jobs`, a profile's `jobs`), passed to
        the shard job's own Snakemake on its node through CLUSTER_JOBS_ENV (1 where it is not
        passed on)."""
        invocation = self.invocation
        if invocation.remote_job:
            return int(os.environ.get(CLUSTER_JOBS_ENV, 1))
        if not invocation.jobs_here:
            os.environ[CLUSTER_JOBS_ENV] = str(invocation.jobs or 1)
            return invocation.jobs or 1
        try:
            slots = len(pool_devices(self.config["gpus"])) or 1
        except ValueError:  # a device this machine lacks: the embed jobs say which
            slots = len(self.config["gpus"])
        gpu = invocation.gpu_resource
        return max(1, min(slots, gpu)) if gpu is not None else slots

    @property
    def on_cluster(self) -> bool:
        """The jobs run on a cluster's nodes (this command submits them, or is one of them)."""
        return not self.invocation.jobs_here or self.invocation.remote_job

    def shard_threads(self) -> int:
        """The shard step's reading processes (esmshard.input.scan): the cores Snakemake has on
        one machine (`--cores`), up to SHARD_THREADS; SHARD_THREADS on a cluster node;
        `--set-threads shard=N` sets another number."""
        return SHARD_THREADS if self.on_cluster else max(1, min(self.cores, SHARD_THREADS))

    def hold_run_lock(self) -> None:
        """Refuse to start where another run is active in the same outdir (esmshard.store.
        runlock), hold the store keys shared, so that no maintenance changes them under the run
        (esmshard.store.storelock); then remove what killed runs left in the outdir and the
        store (esmshard.store.leftovers). Raises RunActiveError."""
        hold(self.run.run_lock, self.config["outdir"], self.log.info)
        if self.location.in_objects:  # the outdir in a bucket, which other machines reach
            lease = self.lease()
            lease.take(self.log.info)
            atexit.register(lease.release)
        if self.store_unwritable:
            self.log.info(
                f"esmshard: reusing a store that cannot be written ({self.store_unwritable})"
            )
        else:
            hold_shared(self.store.root, self.key)
            if self.mutant_key is not None:
                hold_shared(self.store.root, self.mutant_key)
        store = None if self.store_unwritable else self.store
        removed = remove_leftovers(self.config["outdir"], store)
        if removed:
            self.log.info(
                f"esmshard: removed {len(removed)} leftovers of killed runs: "
                + ", ".join(map(str, removed))
            )

    def lease(self) -> Lease:
        """The outdir's lease in object storage (esmshard.store.lease)."""
        outdir = posixpath.normpath(self.config["outdir"])
        return Lease(run_bucket(self.location), self.run.run_lease, self.location.url(outdir))

    def stopped(self, logs) -> None:
        """Where a signal stopped the run (Ctrl-C, SIGTERM: Snakemake's `logs` say so, its
        log files' paths), one line after Snakemake's own last ones: what is kept, and that the
        same command (the one typed: `snakemake ...` or `esmshard run ...`) finishes it."""
        said = ""
        for path in [logs] if isinstance(logs, (str, os.PathLike)) else logs or []:
            try:
                said += Path(path).read_text(errors="replace")
            except OSError:
                continue
        if not STOPPED.search(said):
            return
        line = f"esmshard: stopped; {self.kept_line()}: the same command finishes the run"
        # The command the user typed: `esmshard run`'s own, where it started this Snakemake.
        command = os.environ.get(TYPED_COMMAND_ENV)
        if not command:
            typed = sys.argv
            if Path(sys.argv[0]).name == "snakemake":
                typed = ["snakemake", *sys.argv[1:]]
            command = shlex.join(typed)
        atexit.register(print, f"{line}: {command}", file=sys.stderr, flush=True)

    def say_what_is_kept(self) -> None:
        """One line before the jobs of a run that an earlier command of it began (its plan is
        of these settings): what it finished and kept, so that the rest is what this one does."""
        if not self.invocation.starts_run or not os.path.isfile(self.run.plan_json):
            return
        with open(self.run.plan_json) as fh:
            try:
                planned = json.load(fh)
            except ValueError:
                return  # a damaged plan: planned anew (replan_damaged)
        state = self._state()
        if planned.get("key") != self.key or not state.get("planned") or state["complete"]:
            return
        if state["residues_done"]:
            self.log.info(f"esmshard: resuming: {self.kept_line(state)}; computing the rest")

    def _state(self) -> dict:
        """The run's progress, as `esmshard status` reads it ({} where it cannot be read)."""
        try:
            return read_state(Path(self.run.outdir))
        except (OSError, ValueError, KeyError, TypeError):
            return {}

    def kept_line(self, state: dict | None = None) -> str:
        """What the run has done, as `esmshard status` counts it."""
        state = self._state() if state is None else state
        if not state.get("planned"):
            return "nothing was computed yet"
        kept = state["residues_kept"]
        return (
            f"{state['shards_done']} of {state['shards_total']} shards finished, "
            f"{state['residues_done']:,} of {state['residues_total']:,} residues done"
            + (f" ({kept:,} kept from stopped jobs)" if kept else "")
        )

    def read_run_json(self) -> dict | None:
        """The run's run.json: in the outdir, or in the object store."""
        if self.location.in_objects:
            return read_run_json(self.location, self.run)
        if not os.path.isfile(self.run.run_json):
            return None
        with open(self.run.run_json) as fh:
            return json.load(fh)

    def where(self, path: str) -> str:
        """Where a file of the run is, as its user finds it (an object's URL)."""
        return self.location.url(path)

    def computed_part(self, run: dict) -> str:
        """'N computed (M by this command, K kept from stopped jobs: R residues)'."""
        said = []
        # run.json of an earlier command (nothing was left to merge): this one computed nothing;
        # in object storage no run lock tells the two apart, and this is left out.
        if not self.location.in_objects:
            this = run.get("run_id") == current_run_id(self.run.run_lock)
            said.append(f"{run.get('computed_by_this_command', 0) if this else 0} by this command")
        kept, residues = (run.get(k, 0) for k in ("kept_from_stopped_jobs",
                                                   "residues_kept_from_stopped_jobs"))  # fmt: skip
        if kept:
            said.append(
                f"{kept} kept from stopped jobs" + (f": {residues:,} residues" if residues else "")
            )
        return f"{run['computed']} computed" + (f" ({', '.join(said)})" if said else "")

    def summary(self) -> None:
        """The run's last lines: what was computed (by the plan, and by this command: a command
        that finishes a killed one computes part of it) or reused, and how many sequences failed
        (only when merge ran, e.g. not with --until)."""
        run = self.read_run_json()
        if run is None:
            return
        config = self.config
        long = {"truncate": "truncated", "chunk": "chunked", "skip": "skipped"}
        beyond = (
            f"; {run['long_records']} longer than truncation_seq_length, "
            f"{long.get(run.get('long_sequences'), 'refused')}"
            if run.get("long_records")
            else ""
        )

        def plural(n, word):
            return f"{n} {word}{'s' if n != 1 else ''}"

        self.log.info(
            f"esmshard: {plural(run['records'], 'record')}, "
            f"{plural(run['unique_sequences'], 'unique sequence')}, "
            f"embedded with {run.get('made_by', {}).get('model', config['model'])}: "
            f"{self.computed_part(run)}, "
            f"{run['from_store']} from the store ({run['store']}); {run['failed']} records "
            f"failed, listed in {self.where(self.run.failed)}{beyond}"
        )
        outputs = [self.run.embeddings, self.run.failed, self.run.run_json, self.run.scaling_html]
        outputs += [self.run.variant_scores] if config["variants"] else []
        if config.get("neighbours"):
            outputs += [self.run.neighbours_tsv, self.run.neighbours_parquet]
        outputs += [self.run.annotations_tsv] if config.get("neighbours_annotations") else []
        if config.get("neighbours_terms"):
            outputs += [self.run.transfer_tsv, self.run.transfer_parquet]
        self.log.info(f"esmshard: outputs: {', '.join(map(self.where, outputs))}")
        counts = read_counts(self.run.variant_summary) if config["variants"] else None
        if counts:
            self.log.info(f"esmshard: {counts_line(counts, self.run.variant_scores)}")
        set_aside = run.get("set_aside", [])
        if set_aside:
            self.log.warning(
                f"esmshard: {plural(len(set_aside), 'store part')} failed "
                f"{'its' if len(set_aside) == 1 else 'their'} check, set aside and recomputed "
                f"({set_aside[0]}{', ...' if len(set_aside) > 1 else ''}; "
                f"{self.where(self.run.log('shard'))} says why)"
            )
        mixed = mixed_precisions(run.get("computed_with", []))
        if mixed:
            self.log.warning(f"esmshard: {mixed}")
