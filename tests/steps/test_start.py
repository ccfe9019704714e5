"""A command's start (esmshard.steps.start), without Snakemake: what the command is, read from
its parsed command line as Snakemake's CLI gives it, and what each kind of command does before
its jobs: a dry run, `--lint` and a cluster's executor plan every model and change nothing; a
run on this machine refuses what cannot run here."""

import os
from types import SimpleNamespace

import pytest

from esmshard.layout import Layout
from esmshard.models import parse_spec
from esmshard.steps import invocation, start
from esmshard.steps.invocation import CLUSTER_JOBS_ENV, Invocation, StartRefused
from esmshard.steps.start import RunStart
from esmshard.store import Store


class Resources:
    """Snakemake's parsed resources keep the strings they were given as `args`."""

    def __init__(self, *given):
        self.args = list(given)


def cli(**given):
    """Snakemake's parsed command line, as `snakemake.cli.args_to_api` holds it."""
    args = dict(dryrun=False, lint=None, executor="local", cores=2, jobs=None, resources={},
                default_resources=None, set_resources={}, profile=None)  # fmt: skip
    return SimpleNamespace(**{**args, **given})


SLURM = cli(
    executor="slurm",
    jobs=100,
    cores=None,
    profile=["profiles/slurm"],
    default_resources=Resources(
        "mem_mb=4000", "slurm_partition=CHANGE-ME-partition", "slurm_account=lab"
    ),
    set_resources={"embed": Resources('slurm_account="CHANGE-ME-account"', "runtime=240")},
)


class Said:
    def __init__(self):
        self.lines = []

    def info(self, message):
        self.lines.append(message)

    warning = info


def run_start(tmp_path, invocation, model="random:esmc_6b", **config) -> RunStart:
    outdir = tmp_path / "results"
    spec = parse_spec(model)
    settings = dict(outdir=str(outdir), gpus="auto", model=model, variants=None,
                    variant_scoring=["wt_marginals"], input=[], truncation_seq_length=1022,
                    long_sequences="truncate", variant_offset=1)  # fmt: skip
    return RunStart(
        invocation=invocation,
        config={**settings, **config},
        run=Layout(str(outdir)),
        store=Store(str(outdir / "store")),
        key="0123456789abcdef",
        mutant_key=None,
        model_name=spec.name,
        model_params=spec.params,
        earlier=None,
        log=Said(),
    )


def test_the_command_line_says_what_the_command_is():
    local = Invocation.of(cli())
    assert local.starts_run and local.jobs_here and local.cores == 2
    assert not Invocation.of(cli(dryrun=True)).starts_run
    assert not Invocation.of(cli(lint="text")).starts_run
    slurm = Invocation.of(SLURM)
    assert slurm.starts_run and not slurm.jobs_here and slurm.jobs == 100
    assert slurm.placeholders == (
        "slurm_partition=CHANGE-ME-partition",
        'slurm_account="CHANGE-ME-account"',
    )
    job = Invocation.of(SLURM, remote_job=True)  # a cluster job's own Snakemake, on its node
    assert job.jobs_here and not job.starts_run
    assert Invocation.of(None) == Invocation()  # Snakemake's Python API: a local run


@pytest.fixture
def no_gpu_and_24_gib(monkeypatch):
    """A login node: no GPU, 24 GiB."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.setattr(start, "host_memory_bytes", lambda: 24 * 2**30)


def test_a_model_too_large_for_this_cpu_is_refused_only_where_its_jobs_would_run_here(
    tmp_path, no_gpu_and_24_gib
):
    with pytest.raises(StartRefused) as refused:
        run_start(tmp_path, Invocation.of(cli())).begin()
    (problem,) = refused.value.problems
    assert problem.startswith("model esmc_6b computes on the CPU here") and "GiB" in problem
    for planned in (cli(dryrun=True), cli(lint="text"), cli(executor="slurm", jobs=10),
                    cli(executor="lsf", jobs=10), cli(executor="kubernetes", jobs=10)):  # fmt: skip
        run_start(tmp_path, Invocation.of(planned)).begin()  # no refusal
    run_start(tmp_path, Invocation.of(SLURM, remote_job=True)).begin()
    run_start(tmp_path, Invocation.of(cli()), model="random:esm2_t6_8M_UR50D").begin()


def test_a_profiles_placeholders_are_refused_before_a_submission_and_said_by_a_dry_run(
    tmp_path, no_gpu_and_24_gib
):
    with pytest.raises(StartRefused) as refused:
        run_start(tmp_path, Invocation.of(SLURM)).begin()
    (problem,) = refused.value.problems
    assert "slurm_partition=CHANGE-ME-partition" in problem and "CHANGE-ME-account" in problem
    assert "(cp -r profiles/slurm my-slurm)" in problem and "nothing was submitted" in problem
    dry = run_start(tmp_path, Invocation.of(cli(**{**vars(SLURM), "dryrun": True})))
    dry.begin()
    (line,) = dry.log.lines
    assert line.startswith("esmshard: the profile still holds placeholders (")
    assert line.endswith("before a run submits jobs")
    local = cli(default_resources=Resources("slurm_partition=CHANGE-ME-partition"))
    run_start(tmp_path, Invocation.of(local), model="random:esm2_t6_8M_UR50D").begin()


def test_a_damaged_plan_is_replanned_by_a_run_and_left_alone_by_a_dry_run(tmp_path):
    start_ = run_start(tmp_path, Invocation.of(cli(dryrun=True)), "random:esm2_t6_8M_UR50D")
    shards = tmp_path / "results" / "shards"
    shards.mkdir(parents=True)
    (shards / "plan.tsv").write_text("cut sho")
    start_.begin()
    assert (shards / "plan.tsv").exists() and start_.log.lines == []
    real = run_start(tmp_path, Invocation.of(cli()), "random:esm2_t6_8M_UR50D")
    real.begin()
    assert not shards.exists()
    (line,) = real.log.lines
    assert "the plan is damaged" in line and "planned anew" in line


def test_jobs_at_once_and_shard_processes_where_the_jobs_run(tmp_path, monkeypatch):
    monkeypatch.delenv(CLUSTER_JOBS_ENV, raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    local = run_start(tmp_path, Invocation.of(cli()), gpus=[0, 1, 2, 3])
    assert local.parallel_jobs() == 4
    gpu_2 = cli(resources={"gpu": SimpleNamespace(value=2)})  # --resources gpu=2
    assert run_start(tmp_path, Invocation.of(gpu_2), gpus=[0, 1, 2, 3]).parallel_jobs() == 2
    assert local.shard_threads() == 2 and not local.on_cluster  # --cores 2
    cluster = run_start(tmp_path, Invocation.of(SLURM))
    assert cluster.parallel_jobs() == 100 and os.environ[CLUSTER_JOBS_ENV] == "100"
    assert cluster.shard_threads() == start.SHARD_THREADS and cluster.on_cluster
    job = run_start(tmp_path, Invocation.of(SLURM, remote_job=True))
    assert job.parallel_jobs() == 100 and job.on_cluster  # passed on through the environment


def test_the_command_line_is_found_on_the_stack_of_snakemakes_cli():
    assert invocation.command_line() is None  # not read by Snakemake's command line
    given = cli(dryrun=True)
    namespace = {"__name__": "snakemake.cli", "command_line": invocation.command_line}
    exec("def args_to_api(args, parser):\n    return command_line()", namespace)
    assert namespace["args_to_api"](given, None) is given
