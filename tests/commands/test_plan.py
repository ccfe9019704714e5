"""`esmshard plan`: the run's shards planned here and the jobs it will submit, before any job (the
jobs a real SLURM then receives: tests/workflow/test_slurm.py)."""

import os
import re
import shlex
import subprocess
import sys

import pytest
import yaml
from helpers import (
    MODEL,
    PROTEINS,
    PROTEOME,
    REPO,
    S3_ENV,
    clone_of_workflow,
    doc_block,
    edited_cloud_profile,
    fasta,
    jobs_run,
    moto_server,
    read_records,
    s3_client,
)

from esmshard.commands.plan import (
    PlannedJob,
    dry_run_jobs,
    gpu_time_lines,
    planned_precision,
    sbatch_options,
)
from esmshard.input.sizing import embed_mem_mb
from esmshard.models import parse_spec


def esmshard(*args, cwd, **env_vars):
    env = {
        **os.environ,
        "PATH": f"{os.path.dirname(sys.executable)}{os.pathsep}{os.environ['PATH']}",
        **env_vars,
    }
    return subprocess.run(["esmshard", *args], cwd=cwd, env=env, capture_output=True, text=True)


def filled_profile(folder, **set_resources):
    """profiles/slurm with its placeholders filled, as a user edits a copy of it."""
    profile = yaml.safe_load((REPO / "profiles" / "slurm" / "config.yaml").read_text())
    profile["default-resources"] |= {"slurm_partition": "gpu", "slurm_account": "lab"}
    if set_resources:
        profile["set-resources"] = {"embed": set_resources}
    folder.mkdir()
    (folder / "config.yaml").write_text(yaml.safe_dump(profile))
    return folder


def test_a_slurm_plan_of_esmc_6b_on_a_small_machine_shows_each_jobs_sbatch_options(tmp_path):
    """On a login node without GPUs and with less memory than the model needs: planned, not
    refused, as its jobs run on GPU nodes; the run then uses the plan."""
    filled_profile(tmp_path / "lab-slurm", gpu_model="a100")
    args = [str(PROTEINS), "-o", "out", "--model", "random:esmc_6b", "--profile", "lab-slurm",
            "--config", "shards=3"]  # fmt: skip
    done = esmshard("plan", *args, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert re.fullmatch(
        r"esmshard plan: 40 records, 40 unique sequences: 0 found in the store, 40 to compute "
        r"\([\d,]+ residues\) in 3 shards, planned in out/shards",
        lines[0],
    ), lines[0]
    assert lines[1] == "the jobs the run submits to SLURM, as each will ask:"
    (embed,) = [line for line in lines if line.startswith("  3 embed jobs: sbatch ")]
    mem_mb = embed_mem_mb(parse_spec("random:esmc_6b").params)
    assert f" --mem {mem_mb} " in embed and mem_mb > 24_000  # more than this machine has
    assert " -A lab -p gpu " in embed and embed.endswith(" --cpus-per-task=2 --gpus=a100:1")
    (merge,) = [line for line in lines if line.startswith("  1 merge job: sbatch ")]
    assert "--gpus" not in merge and merge.endswith("(runtime: from its inputs, once they exist)")
    assert "shard job" not in done.stdout  # it ran here: the plan
    hours = [line for line in lines if "GPU-hours on H200s" in line]
    assert len(hours) == 1 and float(hours[0].split()[0]) > 0
    assert any(line.startswith("disk: the store gains about ") for line in lines)
    assert lines[-1] == f"nothing was submitted; esmshard run {' '.join(args)} runs this plan"
    assert not (tmp_path / "out" / "store" / "esmc").exists() and not any(
        (tmp_path / "out" / "logs").glob("embed*")
    )

    # The run's dry run (Snakemake's own account of its jobs) uses the plan and asks the same.
    dry = esmshard("run", *args, "--", "--dry-run", "--cores", "64", cwd=tmp_path)
    assert dry.returncode == 0, dry.stdout + dry.stderr
    stats = dry.stdout[dry.stdout.index("Job stats") :]
    assert "shard" not in stats.split("\n\n")[0] and re.search(r"embed\s+3", stats)
    jobs = [job for job in dry_run_jobs(dry.stdout) if job.rule == "embed"]
    assert len(jobs) == 3
    longest = max(job.resources["runtime"] for job in jobs)
    assert f" -t {longest} " in embed
    assert all(job.resources["mem_mb"] == mem_mb and job.resources["gpu"] == 1 for job in jobs)


def test_a_profile_still_holding_change_me_is_refused_by_name_and_nothing_is_planned(tmp_path):
    """The shipped profile is copied, as docs/clusters.md says, not edited in place; the copy the
    line names is then the one that is refused."""
    done = esmshard("plan", str(PROTEINS), "-o", "out", "--model", MODEL, "--profile", "slurm",
                    cwd=tmp_path)  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    assert "slurm_partition=CHANGE-ME-partition" in done.stderr
    shipped = REPO / "profiles" / "slurm"
    advice = f"copy the profile esmshard ships (cp -r {shipped} my-slurm), set them in "
    assert advice + "my-slurm/config.yaml and run with --profile my-slurm" in done.stderr
    assert "nothing was submitted" in done.stderr
    assert not (tmp_path / "out" / "shards").exists()

    subprocess.run(["cp", "-r", str(shipped), "my-slurm"], cwd=tmp_path, check=True)
    copied = esmshard("plan", str(PROTEINS), "-o", "out", "--model", MODEL, "--profile",
                      "my-slurm", cwd=tmp_path)  # fmt: skip
    assert copied.returncode == 2, copied.stdout + copied.stderr
    assert f"set them in {tmp_path / 'my-slurm'}/config.yaml (docs/clusters.md)" in copied.stderr


def test_plan_typed_from_outside_an_activated_venv_finds_its_snakemake(tmp_path):
    """`.venv/bin/esmshard plan` with the venv's bin off PATH, as the README offers it."""
    outside = {**os.environ, "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [os.path.join(os.path.dirname(sys.executable), "esmshard"), "plan", str(PROTEINS),
         "-o", "out", "--model", MODEL],
        cwd=tmp_path, env=outside, capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    assert done.stdout.splitlines()[-1].startswith("nothing was submitted; esmshard run ")


def test_a_local_plan_of_a_model_too_large_for_this_machines_cpu_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    done = esmshard("plan", str(PROTEINS), "-o", "out", "--model", "random:esmc_6b", cwd=tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "computes on the CPU here" in done.stderr and "GiB" in done.stderr
    assert not (tmp_path / "out" / "shards").exists()


DRY_RUN = """\
[Fri Nov 27 22:54:24 2026]
rule embed:
    input: out/shards/a-0000.tsv, out/shards/plan.json
    output: out/store/x/a-0000.h5
    jobid: 4
    wildcards: shard=a-0000
    threads: 2
    resources: tmpdir=/tmp, mem_mb=4097, mem=4.10 GB, gpu=1, runtime=11, slurm_extra='--qos=a, b'
Shell command: None

[Fri Nov 27 22:54:24 2026]
localrule all:
    input: out/embeddings.h5
    jobid: 0
"""


def test_the_dry_runs_jobs_are_read_with_their_threads_and_resources():
    embed, everything = dry_run_jobs(DRY_RUN)
    assert embed == PlannedJob(
        "embed", "shard=a-0000", 2,
        {"mem_mb": 4097, "gpu": 1, "runtime": 11, "slurm_extra": "'--qos=a, b'"},
    )  # fmt: skip
    assert everything == PlannedJob("all", "", 1, {})


def test_sbatch_options_are_the_slurm_plugins_own():
    job = PlannedJob("embed", "", 4, {"mem_mb": 8000, "runtime": 90, "gpu": 2,
                                      "slurm_partition": "gpu", "constraint": "h100"})  # fmt: skip
    assert sbatch_options(job) == "-p gpu -t 90 -C h100 --mem 8000 --cpus-per-task=4 --gpus=2"
    cpu_job = PlannedJob("merge", "", 1, {"mem_mb": 2000, "slurm_account": "lab"})
    assert sbatch_options(cpu_job) == "-A lab --mem 2000 --ntasks=1 --cpus-per-task=1"


def test_the_docs_plan_shows_what_they_print_and_their_run_submits_no_shard_job(tmp_path):
    """docs/clusters.md's commands as it types them, in a clone (the 650M model's shape with
    random weights: no download), and the output it shows."""
    clone = clone_of_workflow(tmp_path / "clone")
    subprocess.run(f"gzip -c {PROTEINS} > proteome.fasta.gz", shell=True, cwd=clone, check=True)
    (clone / "profiles" / "mycluster").mkdir()
    shipped = (clone / "profiles" / "slurm" / "config.yaml").read_text()
    edited = shipped.replace("CHANGE-ME-partition", "gpu").replace("CHANGE-ME-account", "lab")
    (clone / "profiles" / "mycluster" / "config.yaml").write_text(edited)
    block = doc_block("docs/clusters.md", "## SLURM").splitlines()
    (plan_line,) = [line for line in block if line.startswith("esmshard plan ")]
    (run_line,) = [line for line in block if line.startswith("snakemake --profile ")]
    model = "random:esm2_t33_650M_UR50D"
    done = esmshard(*shlex.split(plan_line)[1:], "--model", model, cwd=clone)
    assert done.returncode == 0, done.stdout + done.stderr
    shown = doc_block("docs/clusters.md", "**`esmshard plan` shows", "```text\n").splitlines()
    printed = done.stdout.splitlines()
    assert shown[-1] == "  ..." and printed[: len(shown) - 1] == shown[:-1], done.stdout

    argv = shlex.split(run_line)
    argv[argv.index("--config") + 1 : argv.index("--config") + 1] = [f"model={model}"]
    env = {
        **os.environ,
        "PATH": f"{os.path.dirname(sys.executable)}{os.pathsep}{os.environ['PATH']}",
    }
    dry = subprocess.run([*argv, "--dry-run"], cwd=clone, env=env, capture_output=True, text=True)
    assert dry.returncode == 0, dry.stdout + dry.stderr
    stats = dry.stdout[dry.stdout.index("Job stats") :].split("\n\n")[0]
    assert "shard" not in stats and re.search(r"embed\s+1", stats), stats


def test_a_plan_with_pseudo_ppl_plans_the_mutants_run_too_and_its_run_uses_that_plan(tmp_path):
    """pseudo_ppl's mutant sequences are a run of their own (outdir/mutants): the plan makes their
    FASTA file and their shards, lists their embed jobs and counts their forward passes in the
    GPU time, and the run that follows makes neither again."""
    records = [r for r in read_records(PROTEINS) if len(r[1]) <= 300][:3]
    fasta(tmp_path / "proteins.fasta", records)
    rows = [(h[1:].split()[0], f"{s[k - 1]}{k}A") for h, s in records[:2] for k in (5, 10)]
    (tmp_path / "variants.csv").write_text(
        "".join(f"{i},{m}\n" for i, m in [("id", "mutant"), *rows])
    )
    args = ["proteins.fasta", "-o", "results", "--model", MODEL, "--config",
            "variants=variants.csv", "variant_scoring=[wt_marginals,pseudo_ppl]"]  # fmt: skip
    without = esmshard("plan", *args[:-3], cwd=tmp_path)  # the records' plan alone first
    assert without.returncode == 0, without.stderr
    hours = re.compile(r"^  ([\d.]+) GPU-hours on H200s", re.M)
    records_hours = float(hours.search(without.stdout)[1])

    done = esmshard("plan", *args, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith(
        "esmshard plan: 3 records, 3 unique sequences: 0 found in the store, 3 "
    )
    # the mutants and their wild types (variants.csv names two proteins)
    residues = sum(len(s) for _, s in records[:2]) * 3
    assert lines[1] == (
        "  and the mutants' run (pseudo_ppl, pllr): 6 mutant sequences, 6 unique sequences: 0 "
        f"found in the store, 6 to compute ({residues:,} residues) in 1 shard, planned in "
        "results/mutants/shards"
    ), done.stdout
    assert re.search(r"^  1 embed_mutants job: threads=\d+ gpu=1 runtime=\d+ mem_mb=\d+$",
                     done.stdout, re.M), done.stdout  # fmt: skip
    assert float(hours.search(done.stdout)[1]) > records_hours

    run = esmshard("run", *args, cwd=tmp_path, ESMSHARD_POOL_DIR=str(tmp_path / "pool"))
    assert run.returncode == 0, run.stdout + run.stderr
    log = (tmp_path / "results" / "logs" / "esmshard-run.log").read_text()
    ran = jobs_run(subprocess.CompletedProcess(run.args, 0, log, ""))
    assert set(ran) == {"embed", "merge", "report", "embed_mutants", "merge_mutants", "variants"}
    assert "esmshard: variants: 4 scored (wt_marginals, pseudo_ppl)" in run.stderr


def test_an_fp8_plans_gpu_time_is_said_at_bf16s_rate_on_the_gpus_that_compute_it(tmp_path):
    """The plan's settings name their precision in the store (settings.json of their key): in
    fp8 the GPU-hours are bf16's measured rate, and A100s, which have no FP8 products, are not
    offered."""
    (tmp_path / "k").mkdir()
    summary = {"store": str(tmp_path), "key": "k", "model_params": 650_000_000}
    rows = [{"estimated_cost": "2e6"}]
    bf16 = gpu_time_lines(rows, summary, planned_precision(summary))  # no settings: as bf16
    assert bf16[0] == "GPU time of the embed jobs in bf16, loading included (estimated):"
    assert [line.split()[-1] for line in bf16[1:]] == ["size)", "H200's)", "312/989)"]
    (tmp_path / "k" / "settings.json").write_text('{"precision": "fp8"}')
    fp8 = gpu_time_lines(rows, summary, planned_precision(summary))
    assert fp8 == [
        "GPU time of the embed jobs in fp8, at bf16's measured rate, loading included "
        "(estimated):",
        bf16[1],
        bf16[2],
        "  (not on A100s or older GPUs: fp8 needs a Hopper GPU)",
    ]


def test_a_local_plan_on_a_machine_without_gpus_gives_the_cpus_time(tmp_path, monkeypatch):
    """LHR_ECOLI's masked scan (1,538 passes of 1,024 tokens) planned where it would compute on
    the CPU: hours, said beside the GPU-hours."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    (lhr,) = [r for r in read_records(PROTEOME) if "|LHR_ECOLI " in r[0]]
    fasta(tmp_path / "lhr.fasta", [lhr])
    done = esmshard("plan", "lhr.fasta", "-o", "lhr", "--model", "random:esm2_t33_650M_UR50D",
                    "--config", "variants=all", "long_sequences=chunk", cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    at = lines.index(
        "CPU time of the embed jobs here (this machine has no GPU they can use), loading "
        "included (estimated):"
    )
    shown = re.fullmatch(r"  (\d+)h(\d\d)m of an embed job's 2 threads, at 1e\+11 FLOP/s "
                         r"\(an esm2_t6's on a 2-core machine; other CPUs differ\)", lines[at + 1])  # fmt: skip
    assert shown and int(shown[1]) >= 2, lines[at + 1]
    assert any("GPU-hours on H200s" in line for line in lines)


def test_a_plan_in_object_storage_is_read_from_the_bucket_and_its_run_uses_it(tmp_path):
    """A cloud profile as its user edits it (moto's server, the local executor: the plugin is
    not installed here): the shard step plans into the bucket, `esmshard plan` says that plan
    by its URL, and the run that follows computes it without sharding again."""
    pytest.importorskip("boto3")
    with moto_server() as port:
        s3_client(port).create_bucket(Bucket="lab")
        s3_client(port).upload_file(str(PROTEINS), "lab", "p/proteins.fasta")
        profile = edited_cloud_profile("awsbatch", "s3://lab/p", port, tmp_path / "profile")
        typed = ["proteins.fasta", "-o", "out", "--model", MODEL, "--profile", str(profile)]
        done = esmshard("plan", *typed, cwd=tmp_path, **S3_ENV)
        lines = done.stdout.splitlines()
        assert done.returncode == 0 and lines[0].startswith("esmshard plan: 40 records, "), (
            done.stdout + done.stderr
        )
        assert lines[0].endswith(" in 1 shard, planned in s3://lab/p/out/shards"), lines[0]
        assert lines[-2].startswith("object storage: the store gains about "), lines
        assert "esmshard-outdir-" not in done.stdout  # the copy read from the bucket goes unsaid
        ran = esmshard("run", *typed, cwd=tmp_path, **S3_ENV)
        assert ran.returncode == 0, ran.stdout + ran.stderr
        # the run's own record of its jobs: Snakemake's log of its last command
        log = sorted((tmp_path / ".snakemake" / "log").glob("*.snakemake.log"))[-1].read_text()
        assert jobs_run(subprocess.CompletedProcess([], 0, log, "")) == {
            "embed": 1,
            "merge": 1,
            "report": 1,
        }, log
