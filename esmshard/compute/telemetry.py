"""GPU telemetry through NVML: which device a job has, and how busy and full it is over time.

NVML numbers devices in PCI bus order and ignores CUDA_VISIBLE_DEVICES, so a job's CUDA device
is matched to its NVML device by PCI bus ID. Every query may be unsupported on some device
(or missing on a stand-in): such a figure is recorded as missing, never raised.
"""

import csv
import logging
import resource
import threading
import time
from contextlib import ExitStack

from ..files import atomic_path

log = logging.getLogger(__name__)
_unavailable_noted = False

FIELDS = [
    "time",
    "utilization_percent",
    "memory_used_bytes",
    "memory_total_bytes",
    "temperature_c",
    "power_w",
]


def peak_memory_mb() -> float:
    """This process's peak resident memory so far (Linux reports it in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _nvml():
    """The initialised pynvml module, or None (with the reason logged once) when NVML is unusable."""
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml
    except (
        Exception
    ) as err:  # ImportError, NVMLError_LibraryNotFound, NVMLError_DriverNotLoaded, ...
        global _unavailable_noted
        if not _unavailable_noted:
            log.info("NVML is not available (%s): carrying on without GPU telemetry", err)
            _unavailable_noted = True
        return None


def _query(fn, *args):
    try:
        return fn(*args)
    except Exception:  # NVMLError_NotSupported and friends: a missing value
        return None


def nvml_device_count() -> int:
    nvml = _nvml()
    if nvml is None:
        return 0
    try:
        return _query(nvml.nvmlDeviceGetCount) or 0
    finally:
        nvml.nvmlShutdown()


def _text(value):
    return value.decode() if isinstance(value, bytes) else value


def cuda_pci_bus_id(device_index: int = 0) -> str | None:
    """PCI bus ID of a CUDA device, in NVML's format, when torch can use CUDA."""
    import torch

    if not torch.cuda.is_available():
        return None
    props = torch.cuda.get_device_properties(device_index)
    return f"{props.pci_domain_id:08X}:{props.pci_bus_id:02X}:{props.pci_device_id:02X}.0"


class Sampler:
    """Samples one NVML device every `interval` seconds into a TSV file, in a background thread."""

    def __init__(self, cuda_visible_device: str, path, interval: float = 1.0):
        self.path, self.interval = path, interval
        self.samples: list[dict] = []
        self.name = self.memory_total = self.bus_id = self.handle = None
        self._stop = threading.Event()
        self._thread = None
        self.nvml = _nvml() if cuda_visible_device else None
        if self.nvml is not None:
            self.handle = self._handle(cuda_visible_device)
        if self.handle is not None:
            self.name = _text(_query(self.nvml.nvmlDeviceGetName, self.handle))
            pci = _query(self.nvml.nvmlDeviceGetPciInfo, self.handle)
            self.bus_id = _text(pci.busId) if pci else None
            memory = _query(self.nvml.nvmlDeviceGetMemoryInfo, self.handle)
            self.memory_total = memory.total if memory else None

    def _handle(self, cuda_visible_device: str):
        nvml = self.nvml
        if cuda_visible_device.startswith(("GPU-", "MIG-")):
            return _query(nvml.nvmlDeviceGetHandleByUUID, cuda_visible_device)
        bus_id = cuda_pci_bus_id()
        if bus_id is not None:
            return _query(nvml.nvmlDeviceGetHandleByPciBusId, bus_id)
        # torch cannot use CUDA here; device indices follow PCI bus order (CUDA_DEVICE_ORDER).
        return _query(nvml.nvmlDeviceGetHandleByIndex, int(cuda_visible_device))

    def sample(self) -> dict:
        nvml, h = self.nvml, self.handle
        util = _query(nvml.nvmlDeviceGetUtilizationRates, h)
        memory = _query(nvml.nvmlDeviceGetMemoryInfo, h)
        power = _query(nvml.nvmlDeviceGetPowerUsage, h)
        return {
            "time": time.time(),
            "utilization_percent": util.gpu if util else None,
            "memory_used_bytes": memory.used if memory else None,
            "memory_total_bytes": memory.total if memory else None,
            "temperature_c": _query(nvml.nvmlDeviceGetTemperature, h, nvml.NVML_TEMPERATURE_GPU),
            "power_w": power / 1000 if power is not None else None,
        }

    def _run(self, writer, fh):
        while True:
            row = self.sample()
            self.samples.append(row)
            writer.writerow(row)
            fh.flush()
            if self._stop.wait(self.interval):
                break

    def __enter__(self):
        """Start sampling into the TSV, which is written (header only without NVML) when the block ends."""
        self._files = ExitStack()
        tmp = self._files.enter_context(atomic_path(self.path))
        fh = self._files.enter_context(open(tmp, "w", newline=""))
        writer = csv.DictWriter(fh, FIELDS, delimiter="\t", lineterminator="\n")
        writer.writeheader()
        if self.handle is not None:
            self._thread = threading.Thread(
                target=self._run, args=(writer, fh), name="nvml-sampler", daemon=True
            )
            self._thread.start()
        return self

    def __exit__(self, *exc):
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
        if self.nvml is not None:
            self.nvml.nvmlShutdown()
        return self._files.__exit__(*exc)

    def summary(self) -> dict:
        """Figures for the shard's metrics; None where NVML gave nothing."""

        def values(key):
            return [s[key] for s in self.samples if s[key] is not None]

        util, used = values("utilization_percent"), values("memory_used_bytes")
        return {
            "gpu_name": self.name,
            "gpu_bus_id": self.bus_id,
            "memory_total_bytes": self.memory_total,
            "telemetry_samples": len(self.samples),
            "mean_utilization_percent": sum(util) / len(util) if util else None,
            "mean_memory_used_bytes": sum(used) / len(used) if used else None,
            "peak_memory_used_bytes": max(used) if used else None,
        }
