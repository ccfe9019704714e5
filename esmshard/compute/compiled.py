"""`compile`: a model's repeated layer compiled by torch's compiler (Inductor), once per kind of
device, and reused by every later job.

One graph serves every layer (the layer's modules are arguments, esmshard.models.layers.
FastForward.block) and every batch: its sizes are symbolic but for the model's dimensions, and
the one number a batch passes, its longest sequence, is rounded up to a power of two.

The compiler's own cache folder is job-private and node-local; after a job that compiled, it is
kept as one entry under `<store>/.compiled/`, keyed by what the compiled code depends on
(CacheKey), and the next job with that key unpacks it before its first batch: it still traces the
layer, but compiles no kernel. An entry is checked before it is used (its key and the SHA-256 of
its bytes): a damaged or foreign one is ignored, and the job's own compilation replaces it. The
compiler keys its own cached kernels by the traced graph too, so a changed layer never runs
stale code.
"""

import hashlib
import io
import json
import logging
import os
import platform
import shutil
import socket
import tarfile
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

from ..config import NUMERICS_VERSION
from ..files import atomic_path, unwritable, user_cache
from ..input.sizing import H200_FLOPS, compute_seconds

log = logging.getLogger(__name__)

# The environment variable torch's compiler takes its cache folder from.
INDUCTOR_CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"


# What compiling costs and gains in a whole job on a GPU, measured on an H200 (esm2_t33, the
# E. coli proteome in bf16, docs/benchmarks.md): a first compile of the layer took 12.0 s and
# loading the compiler beside the model 6.5 s more (a job's loading 7.1 s against 0.6 s eager),
# the device idle meanwhile; with the store's entry for that GPU, tracing took 3.9 s and the
# loading the same. Compiled, the job then computed 2.2x the eager job's tokens/s (332k
# against 144-150k: more than the layer's 1.34x in benchmarks/peers.py, whose batches are warm).
FIRST_COMPILE_SECONDS = 19.0
CACHED_COMPILE_SECONDS = 11.0
COMPILED_SPEEDUP = 2.2


def eager_seconds(cost: float, params: int) -> float:
    """A GPU's eager time for `cost` units of work (esmshard.input.balance) of a model of
    `params`: the H200's measured compiled rate, less what compiling gains. The fastest GPU's,
    so that a slower one, on which compiling repays itself sooner, is not kept from it wrongly
    for long."""
    return compute_seconds(cost, params, H200_FLOPS) * COMPILED_SPEEDUP


def compile_seconds(cached: bool) -> float:
    """What compiling costs a job before its first batch: with the store's entry for this
    device (`cached`), or a first compile."""
    return CACHED_COMPILE_SECONDS if cached else FIRST_COMPILE_SECONDS


def repays(eager: float, cached: bool = False) -> bool:
    """Whether compiling saves more of `eager` seconds than it costs (`compile_seconds`): a
    shard of about 35 s of eager work, or 20 s where the store holds the compiled code."""
    return eager * (1 - 1 / COMPILED_SPEEDUP) > compile_seconds(cached)


def wanted(setting: str | bool, device, eager: float, cached=lambda: False) -> bool:
    """Whether to compile on `device` a shard of `eager` seconds of eager work (`setting` as the
    config has it: YAML files read a bare on and off as true and false). auto: on CUDA devices,
    where the compile repays itself (a proteome of a million tokens is done eagerly in less time
    than compiling takes, even from the store's cache); never on CPUs, where torch's compiled
    kernels ran ESM-2 slower than the eager path's oneDNN products (docs/performance.md).
    `cached()` says whether the store holds this device's compiled code; it is asked only where
    the answer matters."""
    if setting == "auto":
        return device.type == "cuda" and repays(eager, cached())
    return setting in ("on", True)


def device_kind(device) -> str:
    """What compiled kernels are built for: the GPU's name and compute capability, or the CPU's
    architecture and model."""
    import torch

    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        return f"cuda {torch.cuda.get_device_name(device)} sm_{major}{minor}"
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"cpu {platform.machine()} {model}".strip()


class CacheKey(NamedTuple):
    """What a compiled entry depends on; an entry is used only where all of it is equal."""

    torch: str  # version and commit
    triton: str | None
    python: str
    device: str  # device_kind
    family: str
    shape: str  # layers × dimension × heads
    precision: str
    weights: str  # the dense layers' dtype (esmshard.compute.placement.placed)
    batching: str
    numerics: int

    @classmethod
    def of(cls, device, family: str, net, precision: str, batching: str) -> "CacheKey":
        import torch

        try:
            import triton

            triton_version = triton.__version__
        except ImportError:
            triton_version = None
        return cls(
            f"{torch.__version__} {torch.version.git_version}",
            triton_version,
            platform.python_version(),
            device_kind(device),
            family,
            f"{net.num_layers}x{net.embed_dim}x{net.attention_heads}",
            precision,
            str(next(m.weight.dtype for m in net.modules() if isinstance(m, torch.nn.Linear))),
            batching,
            NUMERICS_VERSION,
        )

    @property
    def digest(self) -> str:
        return hashlib.sha256(json.dumps(self._asdict(), sort_keys=True).encode()).hexdigest()


class Entry(NamedTuple):
    """One cache entry's file: a JSON header line (the key, the archive's size and SHA-256),
    then a tar archive of the compiler's cache folder."""

    path: Path

    @classmethod
    def at(cls, root: Path, key: CacheKey) -> "Entry":
        return cls(root / f"{key.digest[:24]}.entry")

    def read(self, key: CacheKey) -> tuple[bytes | None, str | None]:
        """(the archive, None), or (None, why it cannot be used)."""
        try:
            with open(self.path, "rb") as fh:
                header = json.loads(fh.readline())
                archive = fh.read()
        except FileNotFoundError:
            return None, None
        except (OSError, ValueError) as err:
            return None, f"unreadable ({err})"
        if not isinstance(header, dict) or header.get("key") != key._asdict():
            return None, "written for another torch, device, model or esmshard"
        if header.get("bytes") != len(archive):
            return None, f"{len(archive)} bytes where {header.get('bytes')} were written"
        if header.get("sha256") != hashlib.sha256(archive).hexdigest():
            return None, "its bytes changed since they were written (SHA-256)"
        return archive, None

    def usable(self, key: CacheKey) -> bool:
        """Whether this entry holds `key`'s compiled code, whole (what `start` would unpack)."""
        return self.read(key)[0] is not None

    def write(self, key: CacheKey, folder: Path) -> None:
        """The compiler's cache `folder` as this entry, renamed into place whole."""
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as tar:
            for path in sorted(folder.iterdir()):
                if path.name != "locks":  # the compiler's lock files: per process
                    tar.add(path, arcname=path.name)
        archive = buffer.getvalue()
        header = {
            "key": key._asdict(),
            "bytes": len(archive),
            "sha256": hashlib.sha256(archive).hexdigest(),
        }
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(self.path) as part, open(part, "wb") as fh:
            fh.write(json.dumps(header).encode() + b"\n")
            fh.write(archive)


def tensors_in(args):
    """The tensors among `args`, and inside their tuples (a Packed batch)."""
    import torch

    for arg in args:
        if isinstance(arg, torch.Tensor):
            yield arg
        elif isinstance(arg, tuple):
            yield from tensors_in(arg)


def varying_dims(tensor) -> list[int]:
    """The sizes of a layer's input that vary from batch to batch, symbolic in the one compiled
    graph: every size but a floating tensor's last (the model's features, fixed, so that the
    compiler plans its products for them), sizes of 1 left out (they are specialised anyway)."""
    fixed = tensor.ndim - 1 if tensor.is_floating_point() else None
    return [d for d, size in enumerate(tensor.shape) if d != fixed and size != 1]


def vector_probe_folder() -> Path:
    """Where torch's compiler keeps what it builds to learn this machine's vector instructions:
    this user's esmshard cache, a folder per machine (a home shared by unlike nodes)."""
    return user_cache() / "vector-isa" / socket.gethostname()


def probe_vector_instructions(job_folder: Path) -> None:
    """On a CPU the compiler first builds small programs and loads them to learn the vector
    instructions (8 s of 2 cores): built once per machine in `vector_probe_folder`, loaded by
    every later job (1 s), and left out of the job's own compiler folder and so of the entry.
    Where that folder cannot be made or written, the probe builds in `job_folder`."""
    import torch._inductor.cpu_vec_isa

    folder = vector_probe_folder()
    if unwritable(folder):  # a probe that cannot be built there picks a lesser ISA, silently
        folder = job_folder
    os.environ[INDUCTOR_CACHE_ENV] = str(folder)  # the compiler makes the folder
    try:
        torch._inductor.cpu_vec_isa.pick_vec_isa()
    finally:
        os.environ[INDUCTOR_CACHE_ENV] = str(job_folder)


class Compiled:
    """One job's compiled layer: `start` unpacks the cache entry (when there is a good one) and
    sets the net's `compiled_block`; calls record the seconds spent compiling; `finish` keeps
    the compiler's work as the entry when this job compiled anything new, and cleans up.

    `root` is the cache folder (esmshard.store.Store.compiled); None keeps nothing.
    """

    def __init__(self, net, key: CacheKey, root: Path | None):
        self.net = net
        self.key = key
        self.entry = Entry.at(root, key) if root is not None else None
        self.seconds = 0.0
        self.graphs = 0  # graphs traced (and compiled, or taken from the cache)
        self.hit = False
        self.local = None
        self.environment = None  # the compiler's cache folder as it was before `start`
        self.misses_before = 0  # kernels compiled in this process before `start`

    def start(self) -> None:
        import torch
        from torch._dynamo.utils import counters

        self.misses_before = counters["inductor"]["fxgraph_cache_miss"]
        # Node-local and this job's own: what it holds is the entry's or this job's work only.
        self.local = Path(tempfile.mkdtemp(prefix="esmshard-compiled-"))
        self.environment = os.environ.get(INDUCTOR_CACHE_ENV)
        os.environ[INDUCTOR_CACHE_ENV] = str(self.local)
        if self.entry is not None:
            archive, problem = self.entry.read(self.key)
            if problem:
                log.warning(
                    "compiled cache %s ignored: %s; compiling anew", self.entry.path, problem
                )
            elif archive is not None:
                self.hit = self.unpack(archive)
        # The compiler's modules load with the model.
        import torch._inductor.compile_fx  # noqa: F401

        if self.key.device.startswith("cpu"):
            started = time.perf_counter()
            probe_vector_instructions(self.local)
            self.seconds += time.perf_counter() - started

        self.compiled = torch.compile(self.net.block)
        self.net.compiled_block = self

    def unpack(self, archive: bytes) -> bool:
        try:
            with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
                tar.extractall(self.local, filter="data")
        except (tarfile.TarError, OSError) as err:
            log.warning("compiled cache %s ignored: %s; compiling anew", self.entry.path, err)
            shutil.rmtree(self.local, ignore_errors=True)
            self.local.mkdir()
            return False
        return True

    def __call__(self, *args):
        import torch
        from torch._dynamo.utils import counters

        for tensor in tensors_in(args):
            for dim in varying_dims(tensor):
                torch._dynamo.maybe_mark_dynamic(tensor, dim)
        graphs = counters["stats"]["unique_graphs"]
        started = time.perf_counter()
        out = self.compiled(*args)
        if counters["stats"]["unique_graphs"] != graphs:  # this call traced (and compiled)
            self.seconds += time.perf_counter() - started
            self.graphs += counters["stats"]["unique_graphs"] - graphs
        return out

    @property
    def compiled_anew(self) -> int:
        """The graphs this job's compiler built rather than loaded from the entry: none after
        a good cache hit."""
        from torch._dynamo.utils import counters

        return counters["inductor"]["fxgraph_cache_miss"] - self.misses_before

    def finish(self) -> None:
        """Keep the compiler's work where it compiled kernels the entry lacked; clean up."""
        self.net.compiled_block = None
        try:
            if self.entry is not None and self.compiled_anew:
                try:
                    self.entry.write(self.key, self.local)
                except OSError as err:  # a read-only or full store: the results still stand
                    log.warning("compiled code not kept in %s: %s", self.entry.path.parent, err)
        finally:
            shutil.rmtree(self.local, ignore_errors=True)
            if self.environment is None:
                os.environ.pop(INDUCTOR_CACHE_ENV, None)
            else:
                os.environ[INDUCTOR_CACHE_ENV] = self.environment
