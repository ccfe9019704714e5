"""The precisions a forward pass can run in: the one table to extend for a new one."""

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Precision:
    name: str
    autocast_dtype: (
        str | None
    )  # torch dtype autocast computes in; None: the weights' fp32 as they are
    bytes_per_value: (
        int  # activation bytes per value for the token budget (autocast keeps norms in fp32)
    )
    # the layers' dense products in FP8 (esmshard.models.layers.fp8_dense), the rest as autocast
    fp8_products: bool = False


PRECISIONS = {
    p.name: p
    for p in (
        Precision("fp32", None, 4),
        Precision("bf16", "bfloat16", 3),
        Precision("fp16", "float16", 3),
        Precision("fp8", "bfloat16", 3, fp8_products=True),
    )
}
AUTO = "auto"
AUTO_BF16_CAPABILITY = (8, 0)  # Ampere and newer compute bf16 natively
# Hopper and newer: FP8 products with a scale per row of each operand (torch._scaled_mm)
FP8_CAPABILITY = (9, 0)
# Test hook: what `auto` resolves to on a CPU, standing in for a GPU of another generation.
CPU_AUTO_ENV = "ESMSHARD_CPU_AUTO_PRECISION"


class PrecisionError(ValueError):
    """A precision the device cannot compute in."""


def resolve(name: str, device) -> Precision:
    """The configured precision; `auto` is bf16 on GPUs that compute it natively, else fp32.
    fp8 runs on Hopper and newer GPUs, and on CPUs (torch computes its products there too: the
    same numbers, no speed-up), where its error can be measured."""
    if name == "fp8" and device.type == "cuda":
        import torch

        capability = torch.cuda.get_device_capability(device)
        if capability < FP8_CAPABILITY:
            raise PrecisionError(
                f"precision: fp8 needs a GPU of compute capability {FP8_CAPABILITY[0]}."
                f"{FP8_CAPABILITY[1]} or newer (Hopper: H100, H200); "
                f"{torch.cuda.get_device_name(device)} is {capability[0]}.{capability[1]}: "
                "use precision: bf16 (or auto)"
            )
    if name != AUTO:
        return PRECISIONS[name]
    if device.type == "cpu":
        return PRECISIONS[os.environ.get(CPU_AUTO_ENV, "fp32")]
    import torch

    if device.type == "cuda" and torch.cuda.get_device_capability(device) >= AUTO_BF16_CAPABILITY:
        return PRECISIONS["bf16"]
    return PRECISIONS["fp32"]


def autocast(precision: Precision, device):
    """The autocast context for `precision` on `device` (disabled for fp32)."""
    import torch

    dtype = getattr(torch, precision.autocast_dtype) if precision.autocast_dtype else None
    return torch.autocast(device.type, dtype=dtype, enabled=dtype is not None)
