"""What the families' fast forward passes share: dense layers through oneDNN on CPUs in fp32
(see `onednn_available`), rotary position embeddings, and the mark of a fast forward pass.
"""

import functools

import torch
import torch.nn.functional as F


def torch_dense(x, linear, gelu=False, residual=None):
    """`linear(x)`, then GELU or a residual added, as fair-esm's layers do."""
    out = linear(x)
    if gelu:
        out = F.gelu(out)
    return out if residual is None else residual + out


def onednn_dense(x, linear, gelu=False, residual=None):
    """`torch_dense` as one oneDNN call, the GELU or the residual addition fused into the product."""
    op = torch.ops.mkldnn._linear_pointwise
    if residual is not None:
        return op.binary(x, residual, linear.weight, linear.bias, "add")
    return op(x, linear.weight, linear.bias, *(("gelu", [], "none") if gelu else ("none", [], "")))


@functools.cache
def onednn_available() -> bool:
    """Whether `onednn_dense` works in this torch and gives `torch_dense`'s numbers.

    torch hands fp32 matrix products on CPUs to MKL, which takes its AVX2 path on AMD processors;
    oneDNN, also inside torch, picks its kernel from the CPU's features and runs ESM-2's dense
    layers about 2.2× faster there (docs/benchmarks.md), at fp32 accuracy. Its op is internal to
    torch (torch's compiler calls it for CPUs), hence this check, run once, before it is used.
    """
    try:
        with (
            torch.random.fork_rng(devices=[]),
            torch.inference_mode(),
        ):  # leaves the caller's RNG as it was
            linear, x, residual = (
                torch.nn.Linear(16, 8),
                torch.randn(2, 3, 16),
                torch.randn(2, 3, 8),
            )
            return all(
                torch.allclose(
                    onednn_dense(x, linear, **kw), torch_dense(x, linear, **kw), atol=1e-5
                )
                for kw in ({}, {"gelu": True}, {"residual": residual})
            )
    except (AttributeError, RuntimeError):
        return False


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def dense_for(x):
    """`onednn_dense` where it applies (fp32 on a CPU, no autocast), else `torch_dense`."""
    cpu_fp32 = (
        x.device.type == "cpu"
        and x.dtype == torch.float32
        and not torch.is_autocast_enabled("cpu")
    )
    return onednn_dense if cpu_fp32 and onednn_available() else torch_dense


def rotary(inv_freq, length: int, device):
    """cos and sin of each position's angles, 1 × 1 × length × head dim, as `rotate_half` pairs them."""
    t = torch.arange(length, device=device).type_as(inv_freq)
    freqs = torch.outer(t, inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos()[None, None], emb.sin()[None, None]


class FastForward(torch.nn.Module):
    """A forward pass called as `net(tokens, repr_layers, padded)` (esmshard.models.spec.Family).

    `padded`: whether any token is padding, when the caller knows (asking the device would make
    the host wait for it).
    """
