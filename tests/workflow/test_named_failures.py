"""Failures users provoke, through the `snakemake` command line: each named, nothing lost, no wrong answer.

Two runs in one outdir, shard files from elsewhere, counts of an earlier sharding, a full disk,
errors and signals in job logs, a truncated .gz, a busy GPU pool, and an input replaced by other
content under an old modification time.
"""

import json
import os
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import pytest
from helpers import (
    MODEL,
    OTHER_MODEL,
    PROTEINS,
    REPO,
    TINY_MODEL,
    fill,
    jobs_run,
    leftovers,
    planned_parts,
    read_records,
    run_lock_holder,
    small_disk,
    snakemake,
    snakemake_command,
    write_subset,
)

RECORDS = read_records(PROTEINS)
IDS = [h[1:].split()[0] for h, _ in RECORDS]
CONFIG = {"input": str(PROTEINS), "model": MODEL, "shards": 2}


def means(outdir):
    with h5py.File(outdir / "embeddings.h5") as h5:
        return dict(zip(h5["ids"].asstr()[:], h5["mean/6"][:]))


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A finished run of the test proteins in 2 shards: the reference for the runs below."""
    workdir = tmp_path_factory.mktemp("finished")
    snakemake(workdir, CONFIG)
    return workdir


def test_a_second_run_in_an_active_outdir_is_refused_by_name_and_the_first_finishes(
    tmp_path, finished_run
):
    cmd, env = snakemake_command(tmp_path, CONFIG)
    runs = [
        subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        for _ in range(2)
    ]
    outputs = [run.communicate(timeout=600)[0].decode() for run in runs]
    codes = sorted((run.returncode, k) for k, run in enumerate(runs))
    (ok, winner), (refused, loser) = codes
    assert ok == 0 and refused != 0, outputs
    other = runs[winner].pid
    assert (
        f"another esmshard run is active in results: the run of process {other} on host "
        f"{os.uname().nodename}, started " in outputs[loser]
    )
    assert "Finished jobid" not in outputs[loser]  # it ran no job
    outdir = tmp_path / "results"
    reference = means(finished_run / "results")
    got = means(outdir)
    assert list(got) == IDS
    for name in IDS:
        np.testing.assert_array_equal(got[name], reference[name])
    assert leftovers(outdir) == []
    # The lock died with its run: the same command again is not blocked.
    again = snakemake(tmp_path, CONFIG)
    assert "Nothing to be done" in again.stdout + again.stderr


def test_a_run_in_an_outdir_another_run_holds_is_one_line_before_any_job(tmp_path):
    holder = run_lock_holder(tmp_path / "results" / ".esmshard" / "run.lock")
    try:
        done = snakemake(tmp_path, CONFIG, check=False)
    finally:
        holder.kill()
        holder.wait()
    assert done.returncode == 2
    said = [line for line in done.stderr.splitlines() if line.startswith("esmshard:")]
    assert len(said) == 1 and said[0].startswith(
        f"esmshard: another esmshard run is active in results: the run of process {holder.pid}"
    )
    assert len((done.stdout + done.stderr).splitlines()) <= 3  # no job table, no stack lines


def test_shard_files_from_elsewhere_are_refused_by_name(tmp_path, finished_run):
    shutil.copytree(finished_run / "results", tmp_path / "results")
    parts = planned_parts(tmp_path / "results")
    (first, first_part), (second, second_part) = list(parts.items())[:2]
    shown = f"results/store/{first_part.parent.name}/{first_part.name}"

    # Another shard's file under this shard's name; then, set aside, it is rebuilt by the same
    # command alone.
    shutil.copy(second_part, first_part)
    refused = snakemake(tmp_path, CONFIG, check=False)
    assert refused.returncode != 0
    assert f"store part {shown} cannot be merged: it holds shard {second}, not {first}" in (
        refused.stderr
    )
    assert "run the same command again" in refused.stderr and not first_part.exists()
    rebuilt = snakemake(tmp_path, CONFIG)
    assert jobs_run(rebuilt)["embed"] == 1

    # This shard's file from a run of another model.
    other_model = tmp_path / "other"
    snakemake(other_model, CONFIG, "embedded", "--config", f"model={OTHER_MODEL}", "shards=1")
    other_part = next(iter(planned_parts(other_model / "results").values()))
    shutil.copy(other_part, first_part)
    refused = snakemake(tmp_path, CONFIG, check=False)
    assert refused.returncode != 0
    assert (
        f"store part {shown} cannot be merged: it was computed with other settings (checkpoint = "
        in refused.stderr
    )
    assert f'model = "{OTHER_MODEL}" where the store has "{MODEL}"' in refused.stderr
    rebuilt = snakemake(tmp_path, CONFIG)
    assert jobs_run(rebuilt)["embed"] == 1
    assert means(tmp_path / "results").keys() == means(finished_run / "results").keys()


def test_counts_come_from_the_current_plan_and_a_killed_job_shows_stale(tmp_path):
    three = snakemake(tmp_path, CONFIG, "--config", "shards=3")
    assert "shard 3/3 done" in three.stderr
    # Other settings (the store holds nothing of them), in another number of shards.
    two = snakemake(tmp_path, CONFIG, "--config", "shards=2", "repr_layers=[5]")
    assert "shard 1/2 done" in two.stderr and "shard 2/2 done" in two.stderr
    assert "/2 done" not in two.stderr.replace("1/2 done", "").replace("2/2 done", "")
    status = subprocess.run(
        ["esmshard", "status", str(tmp_path / "results")], capture_output=True, text=True
    )
    assert "shards 2/2 (100%)" in status.stdout and "finished" in status.stdout

    # kill -9 the Snakemake run and its job while a shard is half done.
    workdir = tmp_path / "killed"
    typed = ["--config", "shards=2", "toks_per_batch=1100"]
    cmd, env = snakemake_command(workdir, CONFIG, *typed, "--resources", "gpu=1")
    run = subprocess.Popen(cmd, cwd=REPO, env=env, start_new_session=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    outdir = workdir / "results"
    deadline = time.time() + 300
    while not any(
        json.loads(p.read_text() or "{}").get("residues_done", 0) > 0
        for p in (outdir / "progress").glob("*.json")
    ):
        assert run.poll() is None and time.time() < deadline
        time.sleep(0.05)
    os.killpg(run.pid, signal.SIGKILL)
    run.wait()
    for _ in range(50):  # the job's process ends a moment after the signal
        text = subprocess.run(
            ["esmshard", "status", str(outdir)], capture_output=True, text=True
        ).stdout
        if "stale" in text:
            break
        time.sleep(0.1)
    n_done = sum(part.exists() for part in planned_parts(outdir).values())
    assert "stale: process" in text and "is gone" in text
    assert f"shards {n_done}/2" in text and "finished" not in text and "ETA -" not in text
    # Resume is the same command: the killed run's lock does not block it.
    snakemake(workdir, CONFIG, *typed, "--resources", "gpu=1")
    assert list(means(outdir)) == IDS


def test_a_full_disk_is_named_leaves_nothing_behind_and_the_same_command_finishes(tmp_path):
    with small_disk(tmp_path / "disk", 64) as disk:
        # esm2_t6's D = 320, not the micro model's 32: the disk must fill while parts are written.
        config = {**CONFIG, "model": f"random:{TINY_MODEL}", "outdir": str(disk / "results"),
                  "include": ["mean", "per_tok"], "shards": 1}  # fmt: skip
        outdir = disk / "results"
        snakemake(tmp_path, config, "--until", "shard")
        (name, part), *_ = planned_parts(outdir).items()
        store = part.parent
        fill(disk, 512 << 10)  # half a megabyte left: no shard's embeddings fit
        full = snakemake(tmp_path, config, check=False)
        assert full.returncode != 0
        message = f"no space left for {part}: it needs about "
        assert message in full.stderr and "run the same command again" in full.stderr
        assert message in (outdir / "logs" / "embed" / f"{name}.log").read_text()
        assert leftovers(outdir) == [] and not list(store.glob("*.h5"))
        assert "Segmentation" not in full.stderr and "SIGSEGV" not in full.stderr

        # The disk fills up while the shards are written (after the check before writing).
        (disk / "filler").unlink()
        cmd, env = snakemake_command(tmp_path, config)
        run = subprocess.Popen(
            cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        deadline = time.time() + 300
        while not list(store.glob("**/.*.h5.*.tmp")):  # a piece's or the part's, being written
            assert run.poll() is None and time.time() < deadline
            time.sleep(0.02)
        fill(disk, 4096)
        output = run.communicate(timeout=300)[0].decode()
        assert run.returncode != 0
        # the file that could not be written: a kept piece, the part, or the job's progress
        assert f"no space left for {outdir}/" in output, output[-4000:]
        assert "Traceback" not in output and "Exception ignored" not in output  # HDF5's noise
        logs = "".join(p.read_text() for p in (outdir / "logs").rglob("*.log"))
        assert "no space left for" in logs and "while cleaning up" not in logs  # one line
        # (what the job said, should a temporary file stay: the cause of a rare failure here)
        assert leftovers(outdir) == [], f"{output[-3000:]}\n{logs[-3000:]}"

        # Room for the shards but not for the merged file.
        (disk / "filler").unlink()
        snakemake(tmp_path, config, "embedded")
        shard_bytes = sum(p.stat().st_size for p in store.glob("*.h5"))
        fill(disk, shard_bytes // 2)
        full = snakemake(tmp_path, config, check=False)
        assert full.returncode != 0
        assert f"no space left for {outdir}/embeddings.h5" in full.stderr
        assert "no space left" in (outdir / "logs" / "merge.log").read_text()
        assert leftovers(outdir) == [] and not (outdir / "embeddings.h5").exists()

        (disk / "filler").unlink()
        done = snakemake(tmp_path, config)
        assert jobs_run(done)["merge"] == 1 and "embed" not in jobs_run(done)
        assert list(means(outdir)) == IDS


def test_a_file_size_limit_is_named_in_one_line_and_the_same_command_then_finishes(tmp_path):
    """`ulimit -f` stands in for a quota or a full disk: the embed job's part outgrows it."""
    config = {**CONFIG, "include": ["mean", "per_tok"], "shards": 1}
    cmd, env = snakemake_command(tmp_path, config)

    def limited():
        resource.setrlimit(resource.RLIMIT_FSIZE, (300_000, 300_000))

    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True,
                          preexec_fn=limited)  # fmt: skip
    outdir = tmp_path / "results"
    message = "beyond this process's file size limit of 300.0 KB ([Errno 27] File too large)"
    assert done.returncode != 0 and message in done.stderr, done.stderr[-3000:]
    assert "Traceback" not in done.stderr and "Segmentation" not in done.stderr
    (log,) = (outdir / "logs" / "embed").glob("*.log")
    lines = [line for line in log.read_text().splitlines() if message in line]
    assert len(lines) == 1 and "ERROR esmshard: no room for " in lines[0]
    assert leftovers(outdir) == [] and not (outdir / "embeddings.h5").exists()
    snakemake(tmp_path, config)
    assert (outdir / "embeddings.h5").is_file() and leftovers(outdir) == []
    # The export too, and a killed export's temporary folder is removed by the next one.
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    killed = tmp_path / f".npy.esmshard-{socket.gethostname()}-{dead.pid}.tmp"
    killed.mkdir()
    export = [Path(sys.executable).parent / "esmshard", "export", "results", "--format", "npy",
              "--out", "npy"]  # fmt: skip
    done = subprocess.run(export, cwd=tmp_path, capture_output=True, text=True,
                          preexec_fn=limited)  # fmt: skip
    assert done.returncode == 1 and done.stderr.startswith("esmshard export: no room for ")
    assert message in done.stderr and len(done.stderr.splitlines()) == 1
    assert not (tmp_path / "npy").exists() and list(tmp_path.glob(".npy*")) == []


def test_job_logs_say_how_a_job_ended_errors_and_signals(tmp_path):
    # An unexpected error (the pool folder is a file): its traceback is in the job's log.
    (tmp_path / "not-a-folder").write_text("")
    failed = snakemake(tmp_path / "a", CONFIG, "--config", "shards=1", check=False,
                       env={"ESMSHARD_POOL_DIR": str(tmp_path / "not-a-folder")})  # fmt: skip
    assert failed.returncode != 0
    (log,) = [p.read_text() for p in (tmp_path / "a" / "results" / "logs" / "embed").glob("*.log")]
    assert "run_shard: unexpected error" in log and "Traceback" in log
    assert "Error" in log.splitlines()[-1] and "not-a-folder" in log

    # SIGTERM to the job (a cluster's time limit): its log says so; the same command finishes.
    workdir = tmp_path / "b"
    cmd, env = snakemake_command(workdir, CONFIG, "--config", "shards=1", "toks_per_batch=1100")
    run = subprocess.Popen(
        cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    deadline = time.time() + 300
    while not list((workdir / "results" / "progress").glob("*.json")):
        assert run.poll() is None and time.time() < deadline
        time.sleep(0.05)
    (progress,) = (workdir / "results" / "progress").glob("*.json")
    job_log = workdir / "results" / "logs" / "embed" / f"{progress.stem}.log"
    os.kill(json.loads(progress.read_text())["pid"], signal.SIGTERM)
    output = run.communicate(timeout=300)[0].decode()
    assert run.returncode != 0
    log = job_log.read_text()
    assert "run_shard: stopped by SIGTERM" in log and "stopped by SIGTERM" in output
    assert leftovers(workdir / "results") == [] and not progress.exists()
    snakemake(workdir, CONFIG, "--config", "shards=1", "toks_per_batch=1100")
    log = job_log.read_text()
    assert re.search(r"run_shard: done in [\d.]+ s, peak memory \d+ MB$", log.rstrip())
    # Snakemake removed the killed attempt's log before the job ran again; logs/attempts/ keeps it.
    assert "SIGTERM" not in log
    attempts = (job_log.parents[1] / "attempts" / "embed" / job_log.name).read_text()
    assert attempts.index("stopped by SIGTERM") < attempts.index("run_shard: done in")
    assert attempts.endswith(log)


def test_control_bytes_in_the_input_are_named_with_every_other_problem_before_any_job(tmp_path):
    # A NUL in a header once passed the check and failed the embed job in h5py, and a rerun stayed
    # stuck; a CR inside a header added residues silently.
    (_, real), *_ = read_records(PROTEINS)
    hostile = tmp_path / "hostile.fasta"
    hostile.write_bytes(
        b">nul\x00id\n" + real.encode() + b"\n>cr header\rMKV\n" + real.encode() + b"\n"
        b">ok\n" + real.encode() + b"\n>ok\n" + real.encode() + b"\n"
    )
    result = snakemake(tmp_path, CONFIG, "--config", f"input={hostile}", check=False)
    assert result.returncode != 0 and "Traceback" not in result.stderr
    for place in (
        f"{hostile}:1: the header holds a NUL byte (0x00)",
        f"{hostile}:3: the header holds a carriage return (CR) inside a line",
        "duplicate IDs (1 ID)",
    ):
        assert place in result.stderr
        assert place in (tmp_path / "results" / "logs" / "shard.log").read_text()
    assert jobs_run(result) == {"shard": 1}


def test_a_truncated_gz_is_named_and_leaves_nothing(tmp_path):
    whole = tmp_path / "proteins.fa.gz"
    subprocess.run(["gzip", "-c", str(PROTEINS)], stdout=whole.open("wb"), check=True)
    truncated = tmp_path / "truncated.fa.gz"
    truncated.write_bytes(whole.read_bytes()[: whole.stat().st_size // 2])
    for shards in ("3", "auto"):
        result = snakemake(
            tmp_path, CONFIG, "--config", f"input={truncated}", f"shards={shards}", check=False
        )
        assert result.returncode != 0
        message = f"{truncated}: cannot be read to its end"
        assert message in result.stderr and "truncated or corrupt" in result.stderr
        assert message in (tmp_path / "results" / "logs" / "shard.log").read_text()
        assert not (tmp_path / "results" / "shards").exists() or not any(
            (tmp_path / "results" / "shards").iterdir()
        )
        assert leftovers(tmp_path / "results") == []


def test_jobs_waiting_for_the_gpu_pool_say_so_in_the_run_output(tmp_path):
    result = snakemake(tmp_path, CONFIG, "--config", "gpus=[0]")  # no --resources gpu=1
    assert "waits for a GPU: all 1 of the pool's GPUs are in use by other jobs" in result.stderr
    assert "Run with `--resources gpu=1`" in result.stderr
    quiet = snakemake(tmp_path / "limited", CONFIG, "--config", "gpus=[0]", "--resources", "gpu=1")
    assert "waits for a GPU" not in quiet.stderr


def test_gpus_where_none_is_visible_are_one_line_before_any_job_and_status_shows_what_ran(
    tmp_path,
):
    hidden = {"CUDA_VISIBLE_DEVICES": ""}  # none visible, whatever the test machine has
    result = snakemake(tmp_path, CONFIG, "--config", "gpus=[0,1]", "--resources", "gpu=2",
                       env=hidden)  # fmt: skip
    said = [line for line in result.stderr.splitlines() if "GPU" in line]
    assert said == [
        "esmshard: gpus [0, 1], but no GPU is visible here (no NVIDIA driver or device, or "
        "CUDA_VISIBLE_DEVICES hides them): the embed jobs compute on the CPU instead, 2 threads "
        "each, 2 at a time on 8 cores"  # the tests' --cores 8
    ], result.stderr
    # the jobs' own logs still say it, each for its shard
    logs = [p.read_text() for p in (tmp_path / "results" / "logs" / "embed").glob("*.log")]
    assert len(logs) == 2 and all("this torch cannot use CUDA" in log for log in logs)
    status = subprocess.run(["esmshard", "status", str(tmp_path / "results")],
                            capture_output=True, text=True, env={**os.environ, **hidden})  # fmt: skip
    rows = [line.split() for line in status.stdout.splitlines()[2:-1]]
    assert rows and all(row[1] == "cpu" and row[2] == "idle" for row in rows), status.stdout
    assert sum(int(row[3]) for row in rows) == 2, status.stdout  # no "no shard yet" slot


def test_input_replaced_by_other_content_under_an_old_mtime_is_rerun(tmp_path):
    first = write_subset("first_half.fasta", lambda i, h, s: i % 240 == 0)
    second = write_subset("second_half.fasta", lambda i, h, s: i % 240 == 120)
    data = tmp_path / "proteins.fasta"
    shutil.copy(first, data)
    config = {**CONFIG, "input": str(data), "shards": 1}
    snakemake(tmp_path, config)
    old = data.stat().st_mtime - 3600
    shutil.copy(second, data)
    os.utime(data, (old, old))  # as `cp -p` or `rsync -t` of an older file leaves it
    rerun = snakemake(tmp_path, config)
    assert "Params have changed" in rerun.stdout + rerun.stderr
    assert list(means(tmp_path / "results")) == [h[1:].split()[0] for h, _ in read_records(second)]
    again = snakemake(tmp_path, config)
    assert "Nothing to be done" in again.stdout + again.stderr
