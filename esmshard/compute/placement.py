"""Move a model's weights to its device, in the dtypes esmshard's forward pass computes with."""

import torch

from .precision import Precision


def placed(model, device, precision: Precision | None) -> None:
    """`model`'s weights moved to `device` tensor by tensor (host memory never holds a second
    copy), in the dtypes esmshard's forward pass computes with (`precision`): fp32, whatever
    dtype the files hold (the 6B ESM C's are bf16), except on a GPU under autocast (bf16, fp16),
    where the dense layers' weights take its dtype: the values autocast would cast them to for
    each product (the same numbers, half the device memory, no cast per batch). `precision`
    None: in the dtypes they have (fair-esm's own forward pass)."""
    half = None
    if precision and precision.autocast_dtype and device.type != "cpu":
        half = getattr(torch, precision.autocast_dtype)
    moved = {}  # id of a tensor -> what it became: a weight two modules share stays one
    for module in model.modules():
        dense = isinstance(module, torch.nn.Linear)
        for table in (module._parameters, module._buffers):
            for name, tensor in table.items():
                if tensor is None:
                    continue
                if id(tensor) not in moved:
                    dtype = None
                    if precision and tensor.is_floating_point():
                        dtype = half if dense and half else torch.float32
                    moved[id(tensor)] = _moved(tensor, device, dtype)
                table[name] = moved[id(tensor)]


def _moved(tensor, device, dtype):
    """`tensor` on `device` in `dtype` (None: its own), a parameter still one. Its dtype changes
    once it is there: torch converts a blocking host-to-GPU copy on the host, through the CPU's
    threads, where a GPU converts a tensor in microseconds (one fp32 tensor at a time on it)."""
    data = tensor.detach().to(device)
    if dtype is not None:
        data = data.to(dtype)
    if isinstance(tensor, torch.nn.Parameter):
        return torch.nn.Parameter(data, requires_grad=tensor.requires_grad)
    return data
