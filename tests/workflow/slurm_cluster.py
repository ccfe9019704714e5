"""A real single-node SLURM cluster in a temporary directory, for the cluster tests.

munged, slurmctld and slurmd run in the foreground under this process, with their own key,
socket, ports, state and logs; nothing outside the directory is touched. The node offers four
GPUs through `gres` (device files pointing at /dev/null: SLURM then assigns them and sets
CUDA_VISIBLE_DEVICES, while the jobs compute on the CPU). See docs/slurm-test.md.
"""

import os
import shutil
import socket
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path

SLURM_COMMANDS = ("sbatch", "squeue", "scancel", "srun", "sinfo", "scontrol", "sacct")
DAEMONS = ("munged", "mungekey", "slurmctld", "slurmd")


def available() -> bool:
    return all(shutil.which(c) for c in SLURM_COMMANDS + DAEMONS)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


SLURM_CONF = """\
ClusterName=esmshard-test
SlurmctldHost=localhost
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={root}/munge.socket
SlurmctldPort={ctld_port}
SlurmdPort={d_port}
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=1000
SlurmdParameters=config_overrides
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
GresTypes=gpu
MinJobAge=600
ReturnToService=2
SchedulerParameters=sched_interval=1
NodeName=localhost NodeAddr=127.0.0.1 CPUs=8 RealMemory=16000 Gres=gpu:4 State=UNKNOWN
PartitionName=esmshard-test Nodes=localhost Default=YES MaxTime=INFINITE State=UP
"""


def _wait(condition, seconds, what):
    deadline = time.time() + seconds
    while not condition():
        if time.time() > deadline:
            raise TimeoutError(f"SLURM test cluster: {what} did not happen within {seconds} s")
        time.sleep(0.2)


@contextmanager
def cluster(root: Path):
    """Start the cluster; yield the environment that reaches it (PATH with wrappers, SLURM_CONF)."""
    root.mkdir(parents=True, exist_ok=True)
    for sub in ("state", "spool", "dev", "bin"):
        (root / sub).mkdir(exist_ok=True)
    for i in range(4):
        (root / "dev" / f"nvidia{i}").symlink_to("/dev/null")
    conf = root / "slurm.conf"
    conf.write_text(SLURM_CONF.format(root=root, ctld_port=_free_port(), d_port=_free_port()))
    (root / "gres.conf").write_text(f"AutoDetect=off\nName=gpu File={root}/dev/nvidia[0-3]\n")
    # The SLURM plugin's job step drops SLURM_CONF before its inner srun: wrappers put it back.
    for command in SLURM_COMMANDS:
        wrapper = root / "bin" / command
        wrapper.write_text(f'#!/bin/sh\nSLURM_CONF="{conf}" exec {shutil.which(command)} "$@"\n')
        wrapper.chmod(0o755)
    env = {
        **os.environ,
        "SLURM_CONF": str(conf),
        "PATH": f"{root / 'bin'}{os.pathsep}{os.environ['PATH']}",
    }

    subprocess.run(
        ["mungekey", "--create", "--force", "--keyfile", str(root / "munge.key")], check=True
    )
    (root / "munge.key").chmod(0o600)

    def daemon(argv, **kwargs):
        return subprocess.Popen(
            argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **kwargs
        )

    munged = [
        "munged",
        "--foreground",
        "--force",
        f"--socket={root}/munge.socket",
        f"--key-file={root}/munge.key",
        f"--pid-file={root}/munged.pid",
        f"--log-file={root}/munged.log",
        f"--seed-file={root}/munged.seed",
    ]
    daemons = [daemon(munged)]
    try:
        _wait(lambda: (root / "munge.socket").exists(), 10, "munged start")
        daemons.append(daemon(["slurmctld", "-D", "-c", "-i"], env=env))
        daemons.append(daemon(["slurmd", "-D", "-N", "localhost"], env=env))

        def idle():
            out = subprocess.run(
                ["sinfo", "-h", "-o", "%t"], env=env, capture_output=True, text=True
            )
            return out.stdout.strip() == "idle"

        _wait(idle, 60, "the node becoming idle")
        yield env
    finally:
        subprocess.run(
            ["scancel", "--full", "--quiet", "--user=root"], env=env, capture_output=True
        )
        for daemon in reversed(daemons):
            daemon.terminate()
        for daemon in daemons:
            try:
                daemon.wait(timeout=20)
            except subprocess.TimeoutExpired:
                daemon.kill()


def jobs(env) -> list[dict]:
    """Every job slurmctld still knows of (MinJobAge keeps finished ones): its fields as a dict."""
    out = subprocess.run(
        ["scontrol", "show", "job", "--oneliner"], env=env, capture_output=True, text=True
    ).stdout
    records = []
    for line in out.splitlines():
        fields = {}
        for token in line.split():
            key, _, value = token.partition("=")
            fields[key] = value
        if "JobId" in fields:
            records.append(fields)
    return records
