"""A stand-in for nvidia-ml-py's `pynvml`: four GPUs, put first on PYTHONPATH by the tests.

Device 3 does not support temperature queries, as some real boards don't.
"""

import time
from types import SimpleNamespace

NVML_TEMPERATURE_GPU = 0
GIB = 1 << 30
DEVICES = [
    {
        "name": "NVIDIA H100 80GB HBM3",
        "bus": f"00000000:{bus:02X}:00.0",
        "total": 80 * GIB,
        "uuid": f"GPU-fake-{i}",
    }
    for i, bus in enumerate((0x1B, 0x43, 0x52, 0x9D))
]
DEVICES[3]["name"] = "NVIDIA A100-SXM4-40GB"
DEVICES[3]["total"] = 40 * GIB


class NVMLError(Exception):
    pass


class NVMLError_NotSupported(NVMLError):
    pass


class NVMLError_InvalidArgument(NVMLError):
    pass


def nvmlInit():
    pass


def nvmlShutdown():
    pass


def nvmlDeviceGetCount():
    return len(DEVICES)


def nvmlDeviceGetHandleByIndex(index):
    if not 0 <= index < len(DEVICES):
        raise NVMLError_InvalidArgument(index)
    return index


def nvmlDeviceGetHandleByPciBusId(bus_id):
    for i, d in enumerate(DEVICES):
        if d["bus"].lower() == bus_id.lower():
            return i
    raise NVMLError_InvalidArgument(bus_id)


def nvmlDeviceGetHandleByUUID(uuid):
    for i, d in enumerate(DEVICES):
        if d["uuid"] == uuid:
            return i
    raise NVMLError_InvalidArgument(uuid)


def nvmlDeviceGetName(handle):
    return DEVICES[handle]["name"]


def nvmlDeviceGetPciInfo(handle):
    return SimpleNamespace(busId=DEVICES[handle]["bus"].encode())


def nvmlDeviceGetMemoryInfo(handle):
    total = DEVICES[handle]["total"]
    used = (handle + 1) * GIB + int(time.time() * 10) % 7 * (GIB // 8)
    return SimpleNamespace(total=total, used=used, free=total - used)


def nvmlDeviceGetUtilizationRates(handle):
    return SimpleNamespace(gpu=50 + 10 * handle, memory=20)


def nvmlDeviceGetTemperature(handle, sensor):
    if handle == 3:
        raise NVMLError_NotSupported("temperature")
    return 40 + handle


def nvmlDeviceGetPowerUsage(handle):
    return 300_000 + 1000 * handle  # milliwatts
