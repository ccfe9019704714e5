"""`esmshard plan`: a run's shards and the jobs that will compute them, before any job is submitted.

The plan is the run's own: the workflow's shard steps run here (the records', and the mutants'
where pseudo_ppl or pllr scores them), planning for the profile's executor, so the run that
follows uses the shards they wrote. A Snakemake
dry run of the same command then lists every job with its threads and resources as the profile
and esmshard's derived resources give them; under a SLURM profile each is shown as the sbatch
options that snakemake-executor-plugin-slurm submits it with. Nothing is submitted.
"""

import json
import os
import posixpath
import re
import shlex
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import NamedTuple

import yaml

from ..compute.pool import visible_devices
from ..files import free_bytes, human_bytes, nearest_existing, read_tsv
from ..input.sizing import CPU_FLOPS, DEVICE_KINDS, gpu_seconds
from ..layout import Layout
from ..steps.invocation import PLAN_ENV
from ..steps.progress import duration
from ..steps.start import EMBED_THREADS
from ..store import Store, read_json_object
from . import launch
from .bucket_outdir import outdir_in_bucket
from .console import OURS

# The dry run's cores: a cluster's jobs take their threads as asked, not capped by this machine's.
CLUSTER_CORES = "4096"
# A job in Snakemake's dry run: `rule NAME:` (or localrule, checkpoint), then indented fields.
JOB_HEADER = re.compile(r"^(?:local)?(?:rule|checkpoint) (\w+):$")
JOB_FIELD = re.compile(r"^    (\w+): (.*)$")
NEXT_RESOURCE = re.compile(r", (?=[A-Za-z_]\w*=)")
# Snakemake's own resources, and its human-readable copies of them: no request of a scheduler's.
SNAKEMAKE_RESOURCES = {
    "tmpdir",
    "disk_mb",
    "disk",
    "disk_mib",
    "mem",
    "mem_mib",
    "_cores",
    "_nodes",
}
# sbatch options of the plugin's bookkeeping (the job's name, log, comment): no resource.
SBATCH_BOOKKEEPING = {"--job-name", "--output", "--comment"}
TBD = "<TBD>"  # Snakemake's value of a resource that its job's inputs decide, before they exist


class PlannedJob(NamedTuple):
    """A job of the dry run: its rule, wildcards, threads and resources."""

    rule: str
    wildcards: str
    threads: int
    resources: dict


def resource_value(text: str):
    return int(text) if text.isdigit() else text


def dry_run_jobs(text: str) -> list[PlannedJob]:
    """The jobs that Snakemake's dry run lists in `text` (its output)."""
    jobs, fields = [], None
    for line in text.splitlines():
        header = JOB_HEADER.match(line)
        if header:
            fields = {"rule": header[1]}
            jobs.append(fields)
        elif fields is not None and (field := JOB_FIELD.match(line)):
            fields[field[1]] = field[2]
        else:
            fields = None
    return [
        PlannedJob(
            job["rule"],
            job.get("wildcards", ""),
            int(job.get("threads", 1)),
            {
                key: resource_value(value)
                for key, _, value in (
                    item.partition("=") for item in NEXT_RESOURCE.split(job.get("resources", ""))
                )
                if key and key not in SNAKEMAKE_RESOURCES
            },
        )
        for job in jobs
    ]


class _Resources(dict):
    """A job's resources as the SLURM plugin reads them (`.get` and attributes)."""

    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


def sbatch_options(job: PlannedJob) -> str:
    """The sbatch options that snakemake-executor-plugin-slurm submits `job` with."""
    from snakemake_executor_plugin_slurm.submit_string import get_submit_command
    from snakemake_executor_plugin_slurm.utils import set_gres_string

    resources = _Resources(job.resources)
    stand_in = SimpleNamespace(resources=resources, threads=job.threads, name=job.rule)
    account, partition = resources.get("slurm_account"), resources.get("slurm_partition")
    where = {
        "account": f" -A {shlex.quote(str(account))}" if account else "",
        "partition": f" -p {shlex.quote(str(partition))}" if partition else "",
    }
    call = get_submit_command(
        stand_in, {"run_uuid": "", "slurm_logfile": "", "comment_str": "", "workdir": "", **where}
    ) + set_gres_string(stand_in)
    words, kept = iter(shlex.split(call)[1:]), []
    for word in words:
        if word in SBATCH_BOOKKEEPING:
            next(words)
        elif word not in ("--parsable", "--export=ALL"):
            kept.append(word)
    return shlex.join(kept)


def requests(job: PlannedJob, slurm: bool) -> str:
    """What `job` asks its executor for: sbatch options under SLURM, else its resources; a
    resource that depends on outputs not yet made is named as such."""
    later = [key for key, value in job.resources.items() if value == TBD]
    job = job._replace(resources={k: v for k, v in job.resources.items() if k not in later})
    if slurm:
        asked = "sbatch " + sbatch_options(job)
    else:
        asked = " ".join(f"{k}={v}" for k, v in {"threads": job.threads, **job.resources}.items())
    return asked + (f" ({', '.join(later)}: from its inputs, once they exist)" if later else "")


def jobs_lines(jobs: list[PlannedJob], slurm: bool) -> list[str]:
    """One line per rule: its jobs and what each asks for (the longest's, where their runtimes
    differ, with the range)."""
    lines = []
    for rule in dict.fromkeys(job.rule for job in jobs if job.rule != "all"):
        of_rule = [job for job in jobs if job.rule == rule]
        runtimes = sorted(
            job.resources["runtime"]
            for job in of_rule
            if isinstance(job.resources.get("runtime"), int)
        )
        longest = max(of_rule, key=lambda job: job.resources.get("runtime", 0) or 0)
        count = f"{len(of_rule)} {rule} job{'s' if len(of_rule) > 1 else ''}"
        spread = (
            f" (the longest; runtime {runtimes[0]} to {runtimes[-1]} min by shard)"
            if runtimes and runtimes[0] != runtimes[-1]
            else ""
        )
        lines.append(f"  {count}: {requests(longest, slurm)}{spread}")
    return lines


def hours(value: float) -> str:
    """GPU-hours to two significant digits, whole hours past 100."""
    return f"{value:,.0f}" if value >= 100 else f"{value:.2g}"


def gpu_time_lines(plan: list[dict], summary: dict, precision: str | None) -> list[str]:
    """The embed jobs' GPU-hours on each kind of GPU (esmshard.input.sizing.DEVICE_KINDS); in
    fp8 at bf16's rate (fp8's own is not measured yet), on the kinds that compute it."""
    costs = [float(row["estimated_cost"]) for row in plan]
    params = summary.get("model_params")
    if not costs or not params:
        return ["GPU time: none, nothing to compute"]
    fp8 = precision == "fp8"
    kinds = [kind for kind in DEVICE_KINDS if not fp8 or kind.fp8]
    each = [(hours(gpu_seconds(costs, params, kind.flops) / 3600), kind) for kind in kinds]
    return [
        "GPU time of the embed jobs in fp8, at bf16's measured rate, loading included "
        "(estimated):" if fp8
        else "GPU time of the embed jobs in bf16, loading included (estimated):",
        *(
            f"  {value} GPU-hours on {kind.name}s ({kind.basis})" if k == 0
            else f"  {value} on {kind.name}s ({kind.basis})"
            for k, (value, kind) in enumerate(each)
        ),
        *(["  (not on A100s or older GPUs: fp8 needs a Hopper GPU)"] if fp8 else []),
    ]  # fmt: skip


def cpu_time_lines(plan: list[dict], summary: dict) -> list[str]:
    """The embed jobs' time where they compute on this machine's CPU (no GPU here), at the
    rate esmshard assumes of an embed job's two threads (esmshard.input.sizing.CPU_FLOPS)."""
    costs = [float(row["estimated_cost"]) for row in plan]
    params = summary.get("model_params")
    if not costs or not params:
        return []
    seconds = gpu_seconds(costs, params, CPU_FLOPS)
    return [
        "CPU time of the embed jobs here (this machine has no GPU they can use), loading "
        "included (estimated):",
        f"  {duration(seconds)} of an embed job's {EMBED_THREADS} threads, at "
        f"{CPU_FLOPS:.0e} FLOP/s (an esm2_t6's on a 2-core machine; other CPUs differ)",
    ]


def planned_precision(summary: dict) -> str | None:
    """The precision of the planned settings, as the store's settings file of their key says."""
    if "store" not in summary or "key" not in summary:
        return None
    settings = read_json_object(Path(Store(summary["store"]).settings(summary["key"])))
    return (settings or {}).get("precision")


def disk_lines(summary: dict, outdir: str) -> list[str]:
    """What the new parts add to the store, and embeddings.h5's values at most, with the free
    space where each goes."""
    if "store_bytes" not in summary:
        return []
    store = summary["store"]
    return [
        f"disk: the store gains about {human_bytes(summary['store_bytes'])} "
        f"({human_bytes(free_bytes(nearest_existing(store)))} free at {store});",
        f"  embeddings.h5 holds up to {human_bytes(summary['values_bytes'])} of values in float32 "
        f"(half with output_dtype: float16; little with output_values: in_place) "
        f"({human_bytes(free_bytes(nearest_existing(outdir)))} free at {outdir})",
    ]


def bucket_lines(summary: dict) -> list[str]:
    """What the new parts add to a store in object storage, and embeddings.h5's values at most."""
    if "store_bytes" not in summary:
        return []
    return [
        f"object storage: the store gains about {human_bytes(summary['store_bytes'])}; "
        f"embeddings.h5 holds up to {human_bytes(summary['values_bytes'])} of values in float32 "
        "(half with output_dtype: float16; little with output_values: in_place)"
    ]


def where_jobs_run(executor: str) -> str:
    if executor == "local":
        return "the jobs the run starts on this machine, as each asks for its resources:"
    scheduler = "SLURM" if executor == "slurm" else f"the {executor} executor"
    return f"the jobs the run submits to {scheduler}, as each will ask:"


class ShardPlan(NamedTuple):
    """What a shard step planned: its summary (plan.json) and its shards' rows (plan.tsv)."""

    summary: dict
    rows: list[dict]

    @classmethod
    def read(cls, layout: Layout) -> "ShardPlan":
        return cls(json.loads(Path(layout.plan_json).read_text()), read_tsv(layout.plan))

    def line(self, records: str, shard_dir: str) -> str:
        """What it planned of its `records` (records, or mutant sequences) in `shard_dir`."""
        summary = self.summary
        residues = sum(int(row["n_residues"]) for row in self.rows)
        shards = f"{len(self.rows)} shard{'s' if len(self.rows) != 1 else ''}"
        return (
            f"{summary['records']:,} {records}, {summary['unique_sequences']:,} unique sequences: "
            f"{summary['from_store']:,} found in the store, {summary['computed']:,} to compute "
            f"({residues:,} residues) in {shards}, planned in {shard_dir}"
        )


def plan_lines(
    outdir: str, jobs: list[PlannedJob], slurm: bool, executor: str, url: str | None = None
) -> list[str]:
    """What `esmshard plan` says of the plan in `outdir` (and of its mutants', where pseudo_ppl
    or pllr scores them) and the dry run's `jobs`; `url`: the outdir's in object storage, of
    which `outdir` holds a copy."""
    layout, shown = Layout(outdir), Layout(url or outdir)
    plan = ShardPlan.read(layout)
    lines = [f"esmshard plan: {plan.line('records', shown.shard_dir)}"]
    rows = plan.rows
    if Path(layout.mutants.plan_json).is_file():
        mutants = ShardPlan.read(layout.mutants)
        line = mutants.line("mutant sequences", shown.mutants.shard_dir)
        lines.append(f"  and the mutants' run (pseudo_ppl, pllr): {line}")
        rows = rows + mutants.rows  # their forward passes in their costs
    return [
        *lines,
        where_jobs_run(executor),
        *jobs_lines([job for job in jobs if job.rule != "shard"], slurm),
        *gpu_time_lines(rows, plan.summary, planned_precision(plan.summary)),
        *(
            cpu_time_lines(rows, plan.summary)
            if executor == "local" and not visible_devices()
            else []
        ),
        *(bucket_lines(plan.summary) if url else disk_lines(plan.summary, outdir)),
    ]


def profile_values(profile: str | None) -> dict:
    """What a profile sets (Snakemake reads config.v8+.yaml first); none: {}."""
    if not profile:
        return {}
    folder = launch.profile_folder(profile, launch.workflow_root())
    for name in ("config.v8+.yaml", "config.yaml"):
        if (folder / name).is_file():
            return yaml.safe_load((folder / name).read_text()) or {}
    return {}


def executor_of(profile: str | None) -> str:
    """The executor a profile names, else local."""
    return str(profile_values(profile).get("executor", "local"))


def run_snakemake(cmd: list[str], more: list[str], env: dict) -> subprocess.CompletedProcess:
    """`cmd` with `more` (targets, options) before its --config values, which take every word
    after them."""
    at = cmd.index("--config")
    line = [launch.snakemake_executable(), *cmd[1:at], *more, *cmd[at:]]
    return subprocess.run(line, env=env, capture_output=True, text=True)


def plan(planned: launch.Launch, stream=sys.stdout) -> int:
    """Plan the run `planned` describes (its shard step, here), then say what it will submit."""
    cmd = launch.snakemake_command(planned)
    planned = launch.with_config_options(planned)
    executor = executor_of(planned.profile)
    env = {**os.environ, launch.DEFAULTS_ENV: "1"}
    sharded = run_snakemake(cmd, ["planned", "--executor", "local"], {**env, PLAN_ENV: executor})
    if sharded.returncode != 0:
        return failed(sharded)
    dry = ["--dry-run"] + (["--cores", CLUSTER_CORES] if planned.profile else [])
    dry_run = run_snakemake(cmd, dry, env)
    if dry_run.returncode != 0:
        return failed(dry_run)
    text = dry_run.stdout + dry_run.stderr
    slurm = executor == "slurm"
    with planned_outdir(planned) as (outdir, url):
        for line in plan_lines(outdir, dry_run_jobs(text), slurm, executor, url):
            print(line, file=stream)
    typed = ["esmshard", "run", *sys.argv[2:]] if sys.argv[1:2] == ["plan"] else None
    again = shlex.join(typed) if typed else "esmshard run with the same arguments"
    print(f"nothing was submitted; {again} runs this plan", file=stream)
    return 0


@contextmanager
def planned_outdir(planned: launch.Launch):
    """The folder that holds the run's plan, and its URL where the profile keeps the run in
    object storage (the folder a copy of the plan's files: esmshard.commands.bucket_outdir)."""
    profile = profile_values(planned.profile)
    prefix = profile.get("default-storage-prefix")
    if not prefix:
        yield planned.outdir, None
        return
    url = f"{str(prefix).rstrip('/')}/{posixpath.normpath(planned.outdir)}"
    with outdir_in_bucket(url, profile.get("storage-s3-endpoint-url")) as copy:
        yield str(copy), url


def failed(done: subprocess.CompletedProcess) -> int:
    """Say why Snakemake stopped: esmshard's lines, or its whole output in a log file."""
    output = done.stdout + done.stderr
    ours = [m["message"] for line in output.splitlines() if (m := OURS.match(line))]
    with tempfile.NamedTemporaryFile(
        "w", prefix="esmshard-plan-", suffix=".log", delete=False
    ) as log:
        log.write(output)
    for message in ours:
        print(f"esmshard: {message}", file=sys.stderr)
    print(f"esmshard plan: nothing was planned; Snakemake's output: {log.name}", file=sys.stderr)
    return done.returncode or 1
