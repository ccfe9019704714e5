import fcntl
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import MODEL, PROTEINS, REPO, snakemake_command

from esmshard.compute import pool


def test_overlapping_jobs_get_distinct_slots(tmp_path):
    env = {}
    with pool.acquire(["0", "1"], tmp_path, env=env) as first:
        assert (first.index, env["CUDA_VISIBLE_DEVICES"]) == (0, "0")
        with pool.acquire(["0", "1"], tmp_path, env=env) as second:
            assert (second.index, env["CUDA_VISIBLE_DEVICES"]) == (1, "1")
    with pool.acquire(["0", "1"], tmp_path, env=env) as again:
        assert again.index == 0


def test_a_slot_leaves_the_environment_as_it_found_it(tmp_path):
    """An `esmshard.embed` call's process goes on after its slot: its CUDA_VISIBLE_DEVICES too."""
    for env in ({"CUDA_VISIBLE_DEVICES": "2,3", "CUDA_DEVICE_ORDER": "FASTEST_FIRST"}, {}):
        found = dict(env)
        with pool.acquire(["0"], tmp_path, env=env):
            assert env["CUDA_VISIBLE_DEVICES"] == "0"
        assert env == found


def test_cpu_slots_grow_with_demand(tmp_path):
    with pool.acquire([], tmp_path, env={}) as a, pool.acquire([], tmp_path, env={}) as b:
        assert (a.index, b.index) == (0, 1)
        assert a.cuda_visible_devices == ""


def test_killed_job_frees_its_slot(tmp_path):
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from pathlib import Path; from esmshard.compute import pool\n"
            f"with pool.acquire(['0'], Path({str(tmp_path)!r}), env={{}}):\n"
            "    print('held', flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout.readline().strip() == "held"
    env = {}
    waiter = pool.acquire(["0"], tmp_path, poll_seconds=0.05, env=env)
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait()
    started = time.time()
    with waiter as slot:
        assert slot.index == 0 and time.time() - started < 5


def test_scheduler_assigned_device_is_used_as_given(tmp_path):
    env = {"SLURM_JOB_ID": "42", "CUDA_VISIBLE_DEVICES": "3", "ESMSHARD_POOL_DIR": str(tmp_path)}
    devices = pool.pool_devices([0, 1], env)  # the scheduler's choice overrides the config's
    assert devices == ["3"]
    with pool.acquire(devices, env=env) as slot:
        assert slot == pool.Slot(0, "3") and env["CUDA_VISIBLE_DEVICES"] == "3"
        # Another allocation on the node sees its own GPU as device 0 too: no contention.
        other = {
            "SLURM_JOB_ID": "43",
            "CUDA_VISIBLE_DEVICES": "3",
            "ESMSHARD_POOL_DIR": str(tmp_path),
        }
        with pool.acquire(["3"], env=other, poll_seconds=60) as theirs:
            assert theirs == pool.Slot(0, "3")
    assert pool.default_pool_dir(env).name == "slurm-42"


def test_pool_devices_follow_cuda_visible_devices():
    env = {"CUDA_VISIBLE_DEVICES": "2,3,5"}
    assert pool.pool_devices("auto", env) == ["2", "3", "5"]
    assert pool.pool_devices([0, 2], env) == ["2", "5"]
    with pytest.raises(ValueError, match="only 3 are visible"):
        pool.pool_devices([4], env)
    assert pool.visible_devices({"CUDA_VISIBLE_DEVICES": "-1"}) == []
    # No GPU at all: the listed indices still form the pool's slots.
    assert pool.pool_devices([0, 1, 2, 3], {"CUDA_VISIBLE_DEVICES": ""}) == ["0", "1", "2", "3"]


def loaded_torch(pid: int) -> bool:
    """Whether process `pid` has torch's library mapped (it has imported torch)."""
    return "libtorch" in Path(f"/proc/{pid}/maps").read_text()


def test_an_embed_job_waiting_for_the_pool_has_not_imported_torch(tmp_path):
    __import__("torch")
    assert loaded_torch(os.getpid())  # the probe sees an imported torch
    pool_dir = tmp_path / "gpu-pool"
    slot = pool.default_pool_dir({"ESMSHARD_POOL_DIR": str(pool_dir)}) / "gpu0.lock"
    slot.parent.mkdir(parents=True)
    with open(slot, "a") as held:  # another job holds the pool's one GPU
        fcntl.flock(held, fcntl.LOCK_EX)
        cmd, env = snakemake_command(
            tmp_path, {"input": str(PROTEINS), "model": MODEL, "shards": 1, "gpus": [0]},
            "--resources", "gpu=1",
        )  # fmt: skip
        run = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
        try:
            deadline = time.time() + 300
            logs = tmp_path / "results" / "logs" / "embed"
            while not any("waits for a GPU" in p.read_text() for p in logs.glob("*.log")):
                assert run.poll() is None and time.time() < deadline
                time.sleep(0.1)
            waiting = [
                int(p.name)
                for p in Path("/proc").iterdir()
                if p.name.isdigit() and os.getpgid(int(p.name)) == run.pid
                and b"embed.py" in (p / "cmdline").read_bytes()
            ]  # fmt: skip
            assert waiting and not any(loaded_torch(pid) for pid in waiting)
        finally:
            fcntl.flock(held, fcntl.LOCK_UN)
    assert run.wait(timeout=300) == 0
    assert (tmp_path / "results" / "embeddings.h5").is_file()


@pytest.mark.parametrize(
    "gpus, visible, torch_version, why",
    [
        ([0, 1], "", "2.13.0", "no GPU is visible here"),
        ("auto", "", "2.13.0+cpu", None),  # a CPU run, as asked
        ("auto", "0,1", "2.13.0+cpu", "this torch is a CPU-only build (torch 2.13.0+cpu)"),
        ([1], "0,1", "2.13.0+cu130", None),
        ([1], "0,1", "2.13.0", None),
    ],
)
def test_gpus_that_cannot_be_used_are_told_before_any_job(
    monkeypatch, gpus, visible, torch_version, why
):
    monkeypatch.setattr(pool.importlib.metadata, "version", lambda name: torch_version)
    monkeypatch.setattr(pool.sys, "platform", "linux")
    found = pool.no_usable_gpu(gpus, {"CUDA_VISIBLE_DEVICES": visible})
    assert (found is None) if why is None else found.startswith(why)
