"""The workflow on a real SLURM (slurmctld + slurmd + munged on this machine), through profiles/slurm."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import h5py
import numpy as np
import pytest
import slurm_cluster
import yaml
from helpers import (
    MODEL,
    PROTEINS,
    REPO,
    jobs_run,
    kill_9_after_shards,
    planned_parts,
    read_records,
    snakemake,
)

from esmshard.compute.embedder import SLOW_BATCHES_ENV

# One cluster at a time on this machine (its daemons take fixed ports and the one munge
# socket): `make test` gives this file whole to one pytest worker (--dist loadfile).
CONFIG = {"input": str(PROTEINS), "model": MODEL, "shards": 3}


def ensure_slurm_installed():
    if slurm_cluster.available():
        return
    if os.geteuid() != 0 and not os.environ.get("CI"):
        pytest.skip("needs root, or the Debian packages slurm-wlm and munge")
    subprocess.run(
        ["apt-get", "install", "-y", "-q", "slurm-wlm", "munge"],
        check=True,
        env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
        capture_output=True,
    )


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    ensure_slurm_installed()
    with slurm_cluster.cluster(tmp_path_factory.mktemp("slurm")) as env:
        yield env


def filled_profile(tmp_path, set_resources=None) -> str:
    """profiles/slurm with its placeholders filled for the test cluster, plus quick polling (and
    `set_resources`, as a user adds them)."""
    profile = yaml.safe_load((REPO / "profiles" / "slurm" / "config.yaml").read_text())
    if set_resources:
        profile["set-resources"] = set_resources
    profile["default-resources"]["slurm_partition"] = "esmshard-test"
    del profile["default-resources"]["slurm_account"]
    profile["set-threads"]["shard"] = 2  # the test node's cores
    profile.update(
        {
            "slurm-no-account": True,
            "slurm-status-command": "squeue",  # no accounting daemon: sacct cannot answer
            "slurm-init-seconds-before-status-checks": 1,
            "seconds-between-status-checks": 1,
        }
    )
    folder = tmp_path / "profile"
    folder.mkdir()
    (folder / "config.yaml").write_text(yaml.safe_dump(profile))
    return str(folder)


def slurm_command(workdir, profile, env, config=CONFIG):
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "config.yaml").write_text(yaml.safe_dump(config))
    cmd = [
        "snakemake",
        "--profile",
        profile,
        "-s",
        str(REPO / "Snakefile"),
        "-d",
        str(workdir),
        "--configfile",
        str(workdir / "config.yaml"),
    ]
    run_env = {
        **env,
        "PATH": f"{os.path.dirname(sys.executable)}{os.pathsep}{env['PATH']}",
        "ESMSHARD_POOL_DIR": str(workdir / "gpu-pool"),
    }
    return cmd, run_env


def queue_empty(env) -> bool:
    return not subprocess.run(
        ["squeue", "-h"], env=env, capture_output=True, text=True
    ).stdout.strip()


def means(outdir):
    with h5py.File(outdir / "embeddings.h5") as h5:
        return h5["ids"].asstr()[:].tolist(), h5["mean/6"][:]


def test_slurm_run_goes_through_sbatch_resumes_after_kill_and_matches_local(slurm, tmp_path):
    profile = filled_profile(tmp_path)
    cmd, env = slurm_command(tmp_path / "cluster", profile, slurm)
    results = tmp_path / "cluster" / "results"
    metrics = results / "metrics"
    kill_9_after_shards(
        cmd, env, results / "store", 1
    )  # the Snakemake process; its SLURM jobs run on
    deadline = time.time() + 300
    while not queue_empty(slurm):
        assert time.time() < deadline, "SLURM jobs did not finish"
        time.sleep(0.5)
    finished = sorted(p.stem for p in metrics.glob("*.json"))
    assert len(finished) >= 1

    again = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    assert again.returncode == 0, again.stdout + again.stderr
    ran = jobs_run(again)
    assert ran.get("embed", 0) == 3 - len(finished) and "shard" not in ran

    # The scheduler's own records: every job came through sbatch; embed jobs held one GPU each.
    records = slurm_cluster.jobs(slurm)
    by_rule = {}
    for job in records:
        rule = job.get("Comment", "").split("_wildcards_")[0].removeprefix("rule_")
        by_rule.setdefault(rule, []).append(job)
    assert {"shard", "embed", "merge", "report"} <= set(by_rule)
    assert all(
        j["JobState"] == "COMPLETED"
        for rule in ("shard", "embed", "merge", "report")
        for j in by_rule[rule]
    )
    assert all("gpu:1" in j.get("TresPerJob", "") for j in by_rule["embed"])
    assert not any(
        "gpu" in j.get("TresPerJob", "") for r in ("shard", "merge", "report") for j in by_rule[r]
    )
    embedded = {j["Comment"].split("_wildcards_")[1] for j in by_rule["embed"]}
    assert embedded == set(planned_parts(tmp_path / "cluster" / "results"))

    # SLURM chose the GPU of every embed job (CUDA_VISIBLE_DEVICES), and the pool used it.
    for path in sorted(metrics.glob("*.json")):
        m = json.loads(path.read_text())
        assert m["cuda_visible_devices"] in {"0", "1", "2", "3"}

    snakemake(tmp_path / "local", CONFIG, "--resources", "gpu=1")
    ids_cluster, cluster_means = means(tmp_path / "cluster" / "results")
    ids_local, local_means = means(tmp_path / "local" / "results")
    assert ids_cluster == ids_local
    np.testing.assert_allclose(cluster_means, local_means, atol=1e-5)


def test_esmshard_plan_shows_the_sbatch_options_that_slurm_then_receives(slurm, tmp_path):
    """`esmshard plan`, then `esmshard run` with the same arguments: no shard job is submitted
    (the plan is the run's), and each embed job reaches SLURM as the plan said."""
    profile = filled_profile(tmp_path)
    args = [str(PROTEINS), "-o", "results", "--model", MODEL, "--profile", profile,
            "--config", "shards=3"]  # fmt: skip
    env = {
        **slurm,
        "PATH": f"{os.path.dirname(sys.executable)}{os.pathsep}{slurm['PATH']}",
        "ESMSHARD_POOL_DIR": str(tmp_path / "gpu-pool"),
    }
    plan = subprocess.run(["esmshard", "plan", *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True)  # fmt: skip
    assert plan.returncode == 0, plan.stdout + plan.stderr
    (embed,) = [line for line in plan.stdout.splitlines() if line.startswith("  3 embed jobs: ")]
    options = embed.removeprefix("  3 embed jobs: sbatch ").split()
    assert options[:2] == ["-p", "esmshard-test"] and options[2] == "-t", embed
    minutes, mem_mb = int(options[3]), int(options[options.index("--mem") + 1])
    assert options[-2:] == ["--cpus-per-task=2", "--gpus=1"], embed

    run = subprocess.run(["esmshard", "run", *args], cwd=tmp_path, env=env,
                         capture_output=True, text=True)  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    mine = [job for job in slurm_cluster.jobs(slurm) if job.get("WorkDir") == str(tmp_path)]
    rules = [job["Comment"].split("_wildcards_")[0].removeprefix("rule_") for job in mine]
    assert sorted(rules) == ["embed"] * 3 + ["merge", "report"], rules
    for job in (job for job, rule in zip(mine, rules) if rule == "embed"):
        assert job["Partition"] == "esmshard-test"
        assert job["TimeLimit"] == f"{minutes // 60:02d}:{minutes % 60:02d}:00"
        assert job["MinMemoryNode"] == f"{mem_mb}M" and job["CPUs/Task"] == "2"
        assert "gpu:1" in job["TresPerJob"]


def test_on_slurm_the_shard_job_is_given_the_profiles_jobs_for_shards_auto(slurm, tmp_path):
    """`shards: auto` on a cluster: the shard job, which runs there (sbatch), learns the profile's
    `jobs` from the main process; the plan records it."""
    profile = filled_profile(tmp_path)
    cmd, env = slurm_command(tmp_path / "auto", profile, slurm)
    result = subprocess.run(
        [*cmd, "--until", "shard", "--config", "shards=auto"], cwd=REPO, env=env,
        capture_output=True, text=True,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    plan = json.loads((tmp_path / "auto" / "results" / "shards" / "plan.json").read_text())
    jobs = yaml.safe_load((REPO / "profiles" / "slurm" / "config.yaml").read_text())["jobs"]
    assert (plan["slots"], plan["cluster"]) == (jobs, True), result.stdout + result.stderr
    # 40 proteins are far less work than a job's fixed cost on a cluster: one shard
    assert (
        len((tmp_path / "auto" / "results" / "shards" / "plan.tsv").read_text().splitlines()) == 2
    )


def test_a_job_killed_at_its_time_limit_is_resumed_by_the_retry_computing_only_the_rest(
    slurm, tmp_path
):
    # The embed job's time limit cut to a minute, two for the retry (a runtime given as a user
    # would, by the profile's set-resources); each batch takes 3.5 s more (31 batches, 108 s),
    # so that SLURM's limit, not the machine's speed, ends the first job: SIGTERM, SIGKILL
    # KillWait (30 s) later. slurmctld acts on a limit at its own periodic check: at 2.5 s a
    # batch a loaded CI machine's first job ran 85 s, unkilled, and the retry had nothing left.
    profile = filled_profile(tmp_path, {"embed": {"runtime": "attempt"}})
    config = {**CONFIG, "shards": 1, "keep_every": 1, "toks_per_batch": 512}
    cmd, env = slurm_command(tmp_path / "limit", profile, slurm, config)
    env[SLOW_BATCHES_ENV] = "3.5"
    before = {job["JobId"] for job in slurm_cluster.jobs(slurm)}
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr

    embeds = [
        job
        for job in slurm_cluster.jobs(slurm)
        if job["JobId"] not in before and job.get("Comment", "").startswith("rule_embed")
    ]
    assert [(job["JobState"], job["TimeLimit"]) for job in embeds] == [
        ("TIMEOUT", "00:01:00"),
        ("COMPLETED", "00:02:00"),
    ]
    results = tmp_path / "limit" / "results"
    logs = "".join(p.read_text() for p in (results / "logs").rglob("embed/*.log"))
    kept, pieces, rest = map(
        int,
        re.search(r"(\d+) sequences kept by an earlier job \((\d+) pieces\), (\d+) to compute",
                  logs).groups(),
    )  # fmt: skip
    n_records = len(read_records(PROTEINS))
    assert kept > 0 and pieces > 0 and rest > 0 and kept + rest == n_records, logs
    with h5py.File(results / "embeddings.h5") as h5:
        assert len(h5["ids"]) == n_records


def test_jobs_of_a_killed_run_cancelled_as_the_docs_say_then_the_same_command_finishes(
    slurm, tmp_path
):
    # docs/clusters.md: the jobs a killed Snakemake submitted may still run; "cancel them
    # (`scancel --name <run id>`)", the SLURM run ID that the run printed, "before re-running".
    profile = filled_profile(tmp_path)
    cmd, env = slurm_command(tmp_path / "cancel", profile, slurm, {**CONFIG, "keep_every": 1})
    env[SLOW_BATCHES_ENV] = "2"  # embed jobs long enough to be caught running
    run = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, start_new_session=True)  # fmt: skip

    def embed_jobs(state: str) -> int:
        listed = subprocess.run(["squeue", "-h", "-o", "%k %T"], env=slurm, capture_output=True,
                                text=True).stdout.split("\n")  # fmt: skip
        return sum(line.startswith("rule_embed") and line.endswith(state) for line in listed)

    deadline = time.time() + 300
    while not embed_jobs("RUNNING"):
        assert run.poll() is None and time.time() < deadline, "no embed job ran"
        time.sleep(0.5)
    os.killpg(run.pid, signal.SIGKILL)
    printed = run.communicate()[0]
    run_id = re.search(r"SLURM run ID: (\S+)", printed).group(1)
    assert embed_jobs("RUNNING"), "the embed jobs ended with their Snakemake"

    subprocess.run(["bash", "-c", f"scancel --name {run_id}"], env=slurm, check=True)
    deadline = time.time() + 120
    while not queue_empty(slurm):
        assert time.time() < deadline, "scancel left jobs in the queue"
        time.sleep(0.5)
    again = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stdout + again.stderr
    with h5py.File(tmp_path / "cancel" / "results" / "embeddings.h5") as h5:
        assert len(h5["ids"]) == len(read_records(PROTEINS))
