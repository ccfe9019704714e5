"""The GPU pool: one lock file per device, held by the job using it.

Snakemake's `--resources gpu=N` limits how many embed jobs run at once but never says which
device a job got, so each job takes the first free slot here. `flock` locks die with their
process, so a killed job frees its slot without any clean-up.

Inside a cluster job whose scheduler set CUDA_VISIBLE_DEVICES, the pool is what the scheduler
gave (one GPU per job: that GPU), and its locks are the allocation's own: other allocations on
the node may see their GPUs under the same numbers.
"""

import fcntl
import importlib.metadata
import itertools
import logging
import os
import socket
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from .telemetry import nvml_device_count

log = logging.getLogger(__name__)

# Set by cluster schedulers inside a job; with CUDA_VISIBLE_DEVICES they mean "these GPUs are yours".
SCHEDULER_JOB_VARS = ("SLURM_JOB_ID", "PBS_JOBID", "LSB_JOBID")


@dataclass(frozen=True)
class Slot:
    index: int  # pool slot number
    cuda_visible_devices: str  # what the job's CUDA_VISIBLE_DEVICES is set to ("" = CPU)


def scheduler_allocation(env=os.environ) -> str | None:
    """'slurm-123' inside a scheduler job that assigned the GPUs, else None."""
    if "CUDA_VISIBLE_DEVICES" not in env:
        return None
    for var in SCHEDULER_JOB_VARS:
        if var in env:
            return f"{var.split('_')[0].lower()}-{env[var]}"
    return None


def visible_devices(env=os.environ) -> list[str]:
    """The devices CUDA would see from this environment, as CUDA_VISIBLE_DEVICES entries."""
    listed = env.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        entries = [d.strip() for d in listed.split(",") if d.strip()]
        # CUDA stops at the first invalid entry, e.g. "-1" for "no GPU".
        return list(itertools.takewhile(lambda d: not d.startswith("-"), entries))
    return [str(i) for i in range(nvml_device_count())]


def cpu_only_torch() -> str | None:
    """Why the installed torch can use no GPU at all, where its build says so without importing
    it (a CPU-only wheel's version carries `+cpu`; macOS builds have no CUDA); else None."""
    try:
        version = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return None
    if version.partition("+")[2] == "cpu":
        return f"this torch is a CPU-only build (torch {version})"
    if sys.platform == "darwin":
        return f"this torch has no CUDA on macOS (torch {version})"
    return None


def no_usable_gpu(gpus, env=os.environ) -> str | None:
    """Why the embed jobs of a run asking for `gpus` will compute on the CPU, where that can be
    told before any job: the GPUs listed but none visible, or a torch that cannot use them. None
    where they will use GPUs, or where `gpus: auto` finds none (a CPU run, as asked)."""
    if not visible_devices(env):
        if gpus == "auto":
            return None
        return "no GPU is visible here (no NVIDIA driver or device, or CUDA_VISIBLE_DEVICES hides them)"
    return cpu_only_torch()


def pool_devices(gpus, env=os.environ) -> list[str]:
    """The CUDA_VISIBLE_DEVICES value of each pool slot, from the `gpus` config value.

    Indices count the visible devices in the environment Snakemake runs in, in PCI bus order
    (as nvidia-smi numbers them).
    """
    visible = visible_devices(env)
    if gpus == "auto" or scheduler_allocation(env):
        return visible
    if not visible:
        # No GPU here (e.g. a CPU-only test machine): keep one slot per listed index.
        return [str(i) for i in gpus]
    missing = [i for i in gpus if i >= len(visible)]
    if missing:
        raise ValueError(
            f"gpus: {gpus} lists devices {missing}, but only {len(visible)} are visible"
        )
    return [visible[i] for i in gpus]


def default_pool_dir(env=os.environ) -> Path:
    """Host-wide, so that separate runs on one machine never share a GPU; per allocation under a scheduler."""
    base = (
        env.get("ESMSHARD_POOL_DIR")
        or Path(tempfile.gettempdir()) / f"esmshard-gpu-pool-{os.getuid()}"
    )
    return Path(base) / socket.gethostname() / (scheduler_allocation(env) or "")


SET_FOR_A_SLOT = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")  # the environment a slot sets


@contextmanager
def acquire(
    devices: list[str],
    pool_dir: Path | None = None,
    poll_seconds: float = 0.5,
    env=os.environ,
    job: str = "this job",
):
    """Hold a slot for the life of the block and point CUDA_VISIBLE_DEVICES at its device.

    Without devices the slots are CPU slots, as many as jobs ask for, so overlapping jobs
    still get distinct slot numbers.
    """
    pool_dir = pool_dir or default_pool_dir(env)
    pool_dir.mkdir(parents=True, exist_ok=True)
    label = "gpu" if devices else "cpu"
    waited = False
    while True:
        candidates = range(len(devices)) if devices else itertools.count()
        for index in candidates:
            fh = open(pool_dir / f"{label}{devices[index] if devices else index}.lock", "a")
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                fh.close()
                continue
            # as they were, after the block: an `esmshard.embed` call's process goes on
            before = {name: env.get(name) for name in SET_FOR_A_SLOT}
            try:
                slot = Slot(index, devices[index] if devices else "")
                env["CUDA_VISIBLE_DEVICES"] = slot.cuda_visible_devices
                # Device indices are nvidia-smi's and NVML's: PCI bus order.
                env.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
                yield slot
            finally:
                fh.close()
                for name, value in before.items():
                    if value is None:
                        env.pop(name, None)
                    else:
                        env[name] = value
            return
        if not waited:
            # A warning, so that the run's own output shows it: the job holds memory meanwhile.
            log.warning(
                "%s waits for a GPU: all %d of the pool's GPUs are in use by other jobs. "
                "Run with `--resources gpu=%d` so that Snakemake starts no more embed jobs "
                "than there are GPUs",
                job,
                len(devices),
                len(devices),
            )
            waited = True
        time.sleep(poll_seconds)


def pick_device(slot: Slot, threads: int):
    """The torch device of the slot, and its name."""
    import torch

    if torch.cuda.is_available():
        device = torch.device("cuda", 0)
        return device, torch.cuda.get_device_name(device)
    if slot.cuda_visible_devices:
        # Where the run's start could tell, it said so once: here, the log. (Its environment had
        # no slot's CUDA_VISIBLE_DEVICES, which the pool has set here: NVML's devices count.)
        told = no_usable_gpu([slot.index], env={}) is not None
        log.log(
            logging.INFO if told else logging.WARNING,
            "slot %s is GPU %s, but this torch cannot use CUDA (a CPU-only build, or no driver): "
            "computing on the CPU",
            slot.index,
            slot.cuda_visible_devices,
        )
    log.info("no CUDA device available: computing on the CPU with %d threads", threads)
    return torch.device("cpu"), "cpu"
