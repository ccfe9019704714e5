import functools
import json
import math
import os
import re
import shutil
import sys
from pathlib import Path

import yaml
from snakemake.common.tbdstring import TBDString
from snakemake.exceptions import WorkflowError


# Which esmshard runs this workflow: in a clone, the clone's own (beside workflow/, for the driver
# and, through PYTHONPATH, for the jobs); else the package installed in the environment (the
# copy of these files inside it, or a deployed workflow, whose files Snakemake fetches one by
# one). That one must be the version this workflow is released with, in esmshard/version.py.
def esmshard_version_needed():
    with open(workflow.source_path("../../esmshard/version.py")) as fh:
        return re.search(r'^__version__ = "(.+)"$', fh.read(), re.M).group(1)


def use_esmshard():
    needed = esmshard_version_needed()
    clone = Path(workflow.current_basedir.get_path_or_uri(secret_free=True)).parents[1]
    if (clone / "esmshard" / "__init__.py").is_file():
        sys.path.insert(0, str(clone))
        paths = [str(clone), os.environ.get("PYTHONPATH", "")]  # for the jobs' scripts
        os.environ.update(PYTHONPATH=os.pathsep.join(filter(None, paths)))
    try:
        import esmshard
    except ImportError:
        stop(
            f"this workflow needs esmshard {needed}, which is not installed in the Python "
            f"that runs Snakemake ({sys.executable}): {esmshard_install(needed)} there"
        )
    if esmshard.__version__ != needed:
        stop(
            f"this workflow needs esmshard {needed}, but esmshard {esmshard.__version__} is "
            f"installed ({Path(esmshard.__file__).parent}): {esmshard_install(needed)}"
        )


def esmshard_source():
    """Where pip finds the esmshard of this workflow: its repository at the ref the deployment
    names (a deployed module: `github(..., tag=...)`, or git+file for a local clone); None for
    plain files (no index holds esmshard: they say how to build the wheel)."""
    from snakemake.sourcecache import HostingProviderFile, LocalGitFile

    source = workflow.current_basedir
    if isinstance(source, LocalGitFile):
        return f"git+file://{os.path.abspath(source.repo_path)}@{source.ref}"
    if isinstance(source, HostingProviderFile):
        return f"git+https://{source.host}/{source.repo}@{source.ref}"
    return None


def esmshard_install(needed):
    """The command that installs the esmshard this workflow needs, from where it came."""
    source = esmshard_source()
    if source is None:
        return (
            f"install the esmshard {needed} wheel (`make wheel` in a clone of that release "
            "builds it: pip install dist/esmshard-*.whl)"
        )
    return f"pip install '{source}'"


def stop(*problems):
    """End before any job with one line per problem and exit status 2: an exception raised while
    Snakemake reads the workflow would come with its location lines (and, from `validate`, the
    whole schema)."""
    for problem in problems:
        print(f"esmshard: {problem}", file=sys.stderr)
    sys.exit(2)


use_esmshard()

from esmshard.compute.pool import no_usable_gpu, pool_devices, visible_devices
from esmshard.config import embedding_settings
from esmshard.files import read_tsv, unwritable
from esmshard.input.sizing import (
    ModelSize,
    cpu_memory_problem,
    embed_mem_mb,
    embed_runtime_minutes,
    estimated_records,
    host_memory_bytes,
)
from esmshard.embeddings_h5.scores import PLL
from esmshard.input.variants import ALL as VARIANTS_ALL
from esmshard.input.long_sequences import scored_limit
from esmshard.input.variants import MUTANT_KINDS, PSEUDO_PPL, mutant_kinds, mutants_work
from esmshard.models import attention_values
from esmshard.outputs.variants import counts_line, read_counts
from esmshard.layout import Layout
from esmshard.steps.checks import check_config, defaults
from esmshard.steps.provenance import made_by_of, mixed_precisions
from esmshard.steps.shard import plan_problem
from esmshard.store import Store, in_place_problems, settings_key
from esmshard.store.checksums import file_checksums
from esmshard.store.leftovers import remove_leftovers
from esmshard.store.runlock import (
    RunActiveError,
    active_run_problem,
    current_run_id,
    hold,
    run_active,
)
from esmshard.store.storelock import hold_shared

# The whole config checked before any job (esmshard.steps.checks): command-line values arrive as
# YAML's base loader reads them ('gpus=[0,1]' as strings) and take the form the schema asks for;
# `~` means the home folder in every path key. `snakemake --lint` reads the workflow without
# running it (Snakemake gives a Snakefile no other sign of it), and needs no input.
with open(workflow.source_path("../schemas/config.schema.yaml")) as fh:
    SCHEMA = yaml.safe_load(fh)
CHECKED = check_config({**defaults(SCHEMA), **config}, SCHEMA, inputs="--lint" not in sys.argv)
if CHECKED.problems:
    stop(*CHECKED.problems)
config.update(CHECKED.config)

INPUTS = config["input"]
MODEL = CHECKED.model
FAMILY = MODEL.family
RUN = Layout(config["outdir"])
STORE = Store(config["store"] or os.path.join(config["outdir"], "store"))
# A store that cannot be written is used for reuse alone (the shard step refuses a run that
# would add to it): no lock is taken in it, nothing cleaned up.
STORE_UNWRITABLE = unwritable(STORE.root)
MODEL_SIZE = ModelSize(MODEL.params, MODEL.embed_dim)  # read from the model's files

# Settings that change the embeddings: the store keeps what was computed with each (KEY), and
# merge checks every part against them (esmshard.config, esmshard.store).
CHECKPOINT = MODEL.identity(RUN.checksums)  # the weights' identity (a file's: its sha256)
EMBEDDING_PARAMS = embedding_settings(config, FAMILY.name, CHECKPOINT)
KEY = settings_key(EMBEDDING_PARAMS)

# `pseudo_ppl`: the variants' mutant sequences, embedded as a run of their own under
# <outdir>/mutants/ with their pseudo-log-likelihoods alone (esmshard.input.variants).
MUTANTS = RUN.mutants
# The residues of a record that the variants' positions reach (None: whole, chunked).
SCORED_LIMIT = scored_limit(config["truncation_seq_length"], config["long_sequences"])
# pseudo_ppl and pllr read the mutants' run: its pll, its logits (MUTANT_KINDS)
MUTANT_INCLUDE = mutant_kinds(config["variant_scoring"]) if config["variants"] else []
MUTANTS_WANTED = bool(MUTANT_INCLUDE)
MUTANT_PARAMS = embedding_settings(
    {**config, "include": MUTANT_INCLUDE or [PLL]}, FAMILY.name, CHECKPOINT
)
MUTANT_KEY = settings_key(MUTANT_PARAMS)


wildcard_constraints:
    shard=r"[0-9a-f]+-[0-9]+",


def records_mem_mb(bytes_per_record):
    """Memory for a step that keeps `bytes_per_record` per input record, and 2 GB."""
    return lambda wildcards: 2048 + math.ceil(bytes_per_record * estimated_records(INPUTS) / 2**20)


def parallel_jobs():
    """The embed jobs that run at once, for `shards: auto`: on one machine the GPU pool's slots,
    at most `--resources gpu`; with a cluster executor, the jobs Snakemake may have queued or
    running at once (`--jobs`, a profile's `jobs`). The shard job runs on the cluster, and
    Snakemake hands it no value of the main process: the number goes in the environment, which
    sbatch (and bsub) pass on; where it is not passed, 1."""
    if workflow.remote_exec:
        return int(os.environ.get(CLUSTER_JOBS_ENV, 1))
    if not workflow.local_exec:
        os.environ[CLUSTER_JOBS_ENV] = str(workflow.nodes or 1)
        return workflow.nodes or 1
    try:
        slots = len(pool_devices(config["gpus"])) or 1
    except ValueError:  # a device this machine lacks: the embed jobs say which
        slots = len(config["gpus"])
    gpu = getattr(workflow.global_resources.get("gpu"), "value", None)  # --resources gpu=N
    return max(1, min(slots, gpu)) if gpu is not None else slots


CLUSTER_JOBS_ENV = "ESMSHARD_CLUSTER_JOBS"


# The shard step's reading processes at most, unless --set-threads says more: each holds about
# 400 MB (esmshard.input.scan).
SHARD_THREADS = 8


def shard_threads():
    """The shard step's reading processes (esmshard.input.scan): the cores Snakemake has on one
    machine (`--cores`), up to SHARD_THREADS; SHARD_THREADS on a cluster node;
    `--set-threads shard=N` sets another number."""
    if workflow.local_exec and not workflow.remote_exec:
        try:
            return min(workflow.cores, SHARD_THREADS)
        except WorkflowError:  # no --cores: Snakemake asks for it before any job
            return 1
    return SHARD_THREADS


def shard_params(inputs, settings):
    """The shard step's params for `inputs` embedded with `settings` (the records', or the
    mutants' of `pseudo_ppl`)."""
    return dict(
        # New content under an old mtime re-runs this step too (esmshard.store.checksums).
        input_sha256=lambda wildcards: file_checksums(inputs, RUN.checksums),
        shards=config["shards"],
        # embed jobs at once, on one machine or a cluster: `shards: auto` makes at least as
        # many shards (on a cluster, where the work allows)
        slots=lambda wildcards: parallel_jobs() if config["shards"] == "auto" else None,
        cluster=lambda wildcards: (
            (not workflow.local_exec or workflow.remote_exec)
            if config["shards"] == "auto"
            else None
        ),
        model_size=list(MODEL_SIZE),
        store=STORE.root,
        settings=settings,
        # with attention maps: their values per pair of residues, and bytes of one in the output
        attention_values=list(attention_values(MODEL, {**config, **settings})),
        truncation_seq_length=config["truncation_seq_length"],
        long_sequences=config["long_sequences"],
        nucleotide_check=config["nucleotide_check"],
    )


def shard_mem_mb(wildcards, threads):
    """The shard step's memory: streaming, at most ~32 bytes per record (esmshard.steps.shard),
    and each reading process's ~400 MB."""
    return records_mem_mb(32)(wildcards) + 400 * threads


def planned_shards(wildcards=None, checkpoint="shard", layout=RUN):
    """A run's shards (the records', or with `shard_mutants` the mutants'): known once its
    shard step (a checkpoint) has read the input and the store."""
    getattr(checkpoints, checkpoint).get()
    return [row["shard"] for row in read_tsv(layout.plan)]


def merge_inputs_of(checkpoint, layout, key):
    """The record table, the plan and the shards of a run (`layout`, its settings `key`); the
    store's parts that the run reuses are no job's outputs here, and merge checks them itself."""
    shards = planned_shards(None, checkpoint, layout)
    return {
        "records": layout.records,
        "plan": layout.plan_json,
        "shards": [STORE.part(key, shard) for shard in shards],
        "metrics": [layout.metrics(shard) for shard in shards],
    }


def merge_inputs(wildcards):
    return merge_inputs_of("shard", RUN, KEY)


def variant_table_inputs(wildcards):
    """The input (the records' sequences), and the variants table where one is given
    (`variants: all` has none): what the mutants' FASTA file is made from."""
    found = {"inputs": INPUTS}
    if config["variants"] != VARIANTS_ALL:
        found["table"] = config["variants"]
    return found


def variants_inputs(wildcards):
    """`variant_table_inputs`, embeddings.h5, and with `pseudo_ppl` the mutants' embeddings.h5."""
    found = {"embeddings": RUN.embeddings, **variant_table_inputs(wildcards)}
    if MUTANTS_WANTED:
        found["mutants"] = MUTANTS.embeddings
    return found


def mutant_merge_inputs(wildcards):
    return merge_inputs_of("shard_mutants", MUTANTS, MUTANT_KEY)


def variant_outputs():
    """What `variants` adds to the run's targets."""
    if not config["variants"]:
        return []
    return [RUN.variant_scores, RUN.variant_scores_parquet]


# Cluster resources (used by profiles/slurm; a profile's set-resources overrides them).


@functools.cache
def shard_costs(plan_path, plan_mtime_ns):
    """The plan's estimated cost per shard, read once per version of the plan (not per job)."""
    return {row["shard"]: float(row["estimated_cost"]) for row in read_tsv(plan_path)}


def embed_runtime(wildcards, input, attempt):
    if not os.path.isfile(input.plan):
        return TBDString()  # before sharding; Snakemake evaluates it again once the plan exists
    costs = shard_costs(input.plan, os.stat(input.plan).st_mtime_ns)
    return embed_runtime_minutes(costs[wildcards.shard], MODEL_SIZE.params, attempt)


def io_runtime(wildcards, input, attempt):
    """Minutes for a step that streams its inputs once: 10 plus a minute per 200 MB."""
    return math.ceil(10 + input.size_mb / 200) * attempt


def report_run():
    """The run's last lines: what was computed (by the plan, and by this command: a command that
    finishes a killed one computes part of it) or reused, and how many sequences failed (only
    when merge ran, e.g. not with --until)."""
    if not os.path.isfile(RUN.run_json):
        return
    with open(RUN.run_json) as fh:
        run = json.load(fh)
    # run.json of an earlier command (nothing was left to merge): this one computed nothing.
    by_this_command = (
        run.get("computed_by_this_command", 0)
        if run.get("run_id") == current_run_id(RUN.run_lock)
        else 0
    )
    long = {"truncate": "truncated", "chunk": "chunked", "skip": "skipped"}
    beyond = (
        f"; {run['long_records']} longer than truncation_seq_length, "
        f"{long.get(run.get('long_sequences'), 'refused')}"
        if run.get("long_records")
        else ""
    )
    logger.info(
        f"esmshard: {run['records']} record{'s' if run['records'] != 1 else ''}, "
        f"{run['unique_sequences']} unique sequence{'s' if run['unique_sequences'] != 1 else ''}, "
        f"embedded with {run.get('made_by', {}).get('model', config['model'])}: "
        f"{run['computed']} computed ({by_this_command} by this command), "
        f"{run['from_store']} from the store ({run['store']}); {run['failed']} records failed, "
        f"listed in {RUN.failed}{beyond}"
    )
    outputs = [RUN.embeddings, RUN.failed, RUN.run_json, RUN.scaling_html]
    outputs += [RUN.variant_scores] if config["variants"] else []
    logger.info(f"esmshard: outputs: {', '.join(outputs)}")
    counts = read_counts(RUN.variant_scores_parquet) if config["variants"] else None
    if counts:
        logger.info(f"esmshard: {counts_line(counts, RUN.variant_scores)}")
    mixed = mixed_precisions(run.get("computed_with", []))
    if mixed:
        logger.warning(f"esmshard: {mixed}")


# What made the outdir's embeddings.h5, if it has one (a run before this one): read once, by the
# two checks below.
EARLIER = made_by_of(RUN.embeddings)


def refuse_an_active_run():
    """One line before the DAG where another run holds this outdir (onstart takes the lock; two
    runs started at the same moment are told apart there)."""
    if workflow.dryrun or workflow.remote_exec or "--lint" in sys.argv:
        return
    problem = active_run_problem(RUN.run_lock, config["outdir"], logger.info)
    if problem:
        stop(problem)


refuse_an_active_run()


def repair_in_place():
    """An in-place embeddings.h5 whose store parts are gone or changed is removed with its plan,
    so that this run computes what the store lacks and writes it anew (the repair its readers
    advise, esmshard.embeddings_h5.in_place.REPAIR). Not in a dry run, nor in a cluster job, nor where another
    run is active in the outdir (its own start says so)."""
    if workflow.dryrun or workflow.remote_exec or "--lint" in sys.argv:
        return
    if (EARLIER or {}).get("settings_key") != KEY:
        return  # no output, or another's: this run replaces it (say_what_is_replaced)
    problems = in_place_problems(RUN.embeddings, RUN.checksums)
    if not problems or run_active(RUN.run_lock):
        return
    os.remove(RUN.embeddings)
    shutil.rmtree(RUN.shard_dir, ignore_errors=True)
    more = f" and {len(problems) - 1} more" if len(problems) > 1 else ""
    logger.warning(
        f"esmshard: {RUN.embeddings} read its values in place from store parts that are gone "
        f"or changed ({problems[0]}{more}): removed it and its plan; the sequences the store "
        "lacks are computed again"
    )


repair_in_place()


def replan_damaged():
    """A plan that is damaged (its files cut short, replaced or gone: esmshard.steps.shard.
    plan_problem) is removed with the embeddings.h5 merged from it, so that this run plans anew
    and merges again (Snakemake reruns no shard step whose run's outputs exist): the store keeps
    what was computed. Not in a dry run, nor in a cluster job, nor where another run is active."""
    if workflow.dryrun or workflow.remote_exec or "--lint" in sys.argv:
        return
    if not os.path.isdir(RUN.shard_dir) or run_active(RUN.run_lock):
        return
    # The shard step writes its folder whole (atomically): one without any of its plan files is
    # not esmshard's to remove.
    if not any(os.path.lexists(path) for path in (RUN.plan, RUN.plan_json, RUN.records)):
        return
    problem = plan_problem(RUN)
    if problem:
        shutil.rmtree(RUN.shard_dir)
        if os.path.isfile(RUN.embeddings):
            os.remove(RUN.embeddings)
        logger.warning(
            f"esmshard: {RUN.shard_dir}: {problem}: planned anew and merged again (the store "
            "keeps what was computed)"
        )


replan_damaged()


def say_what_is_replaced():
    """One line where the outdir holds results of other settings (another model, other layers):
    this run writes its own over them; their numbers stay in the store."""
    if workflow.dryrun or workflow.remote_exec or "--lint" in sys.argv:
        return
    if EARLIER and EARLIER.get("settings_key") not in (None, KEY):
        logger.warning(
            f"esmshard: {RUN.embeddings} holds {EARLIER.get('model')}'s embeddings of other "
            f"settings (key {EARLIER.get('settings_key')}): this run replaces it with "
            f"{config['model']}'s (key {KEY}); the earlier numbers stay in the store "
            "(`esmshard store` lists them)"
        )


say_what_is_replaced()


def say_pseudo_ppl_work():
    """One line before any job: what `pseudo_ppl` computes, a pass per residue of each mutant."""
    if not MUTANTS_WANTED or workflow.remote_exec or "--lint" in sys.argv:
        return
    strategies = [s for s in config["variant_scoring"] if s in MUTANT_KINDS]
    work = mutants_work(INPUTS, config["variants"], SCORED_LIMIT, config["variant_offset"],
                        strategies, config["truncation_seq_length"])  # fmt: skip
    each = (
        "one per residue of each, and one unmasked"
        if PSEUDO_PPL in strategies
        else "one each, unmasked"
    )
    logger.info(
        f"esmshard: {', '.join(strategies)}: {work.sequences:,} mutant sequences, "
        f"{work.passes:,} forward passes ({each}), embedded in {MUTANTS.outdir}"
    )


say_pseudo_ppl_work()

# Each embed job's CPU threads (torch's, where it computes on the CPU).
EMBED_THREADS = 2


def say_no_usable_gpu():
    """One line, before any job, where the GPUs asked for cannot be used: the embed jobs compute
    on the CPU, and the cores, not the pool's slots, set how many run at once. A model whose
    embed job needs more memory than the machine has is refused there (the 6B ESM C, the 15B
    ESM-2 on a workstation without GPUs)."""
    if workflow.dryrun or not workflow.local_exec or "--lint" in sys.argv:
        return
    why = no_usable_gpu(config["gpus"])
    # None also where `gpus: auto` finds no GPU, a CPU run as asked: told apart without asking
    # NVML again where GPUs were listed
    if why is None and (config["gpus"] != "auto" or visible_devices()):
        return
    too_large = cpu_memory_problem(MODEL.name, MODEL.params, host_memory_bytes())
    if too_large:
        stop(too_large)
    if why is None:  # gpus: auto, and no GPU: a CPU run, as asked
        return
    at_once = max(1, min(parallel_jobs(), workflow.cores // EMBED_THREADS))
    logger.warning(
        f"esmshard: gpus {config['gpus']}, but {why}: the embed jobs compute on the CPU instead, "
        f"{EMBED_THREADS} threads each, "
        + ("one after another" if at_once == 1 else f"{at_once} at a time")
        + f" on {workflow.cores} cores"
    )


say_no_usable_gpu()


def hold_run_lock():
    """Refuse to start where another run is active in the same outdir (esmshard.store.runlock), hold
    the store key shared, so that no maintenance changes it under the run (esmshard.store.storelock);
    then remove what killed runs left in the outdir and the store (esmshard.store.leftovers)."""
    try:
        hold(RUN.run_lock, config["outdir"], logger.info)
    except RunActiveError as err:
        raise WorkflowError(str(err))
    if STORE_UNWRITABLE:
        logger.info(f"esmshard: reusing a store that cannot be written ({STORE_UNWRITABLE})")
    else:
        hold_shared(STORE.root, KEY)
        if MUTANTS_WANTED:
            hold_shared(STORE.root, MUTANT_KEY)
    removed = remove_leftovers(config["outdir"], None if STORE_UNWRITABLE else STORE)
    if removed:
        logger.info(
            f"esmshard: removed {len(removed)} leftovers of killed runs: "
            + ", ".join(map(str, removed))
        )
