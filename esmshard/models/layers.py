"""What the families' fast forward passes share: dense layers through oneDNN on CPUs in fp32
(see `onednn_available`), with the GELU in the product on CUDA in half precision
(`epilogue_gelu_dense`) and in FP8 (`fp8_dense`), rotary position embeddings, packed batches,
and the mark of a fast forward pass.
"""

import functools
import importlib.util
from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F

# The half precisions a CUDA product can apply GELU in (`epilogue_gelu_dense`).
HALF = (torch.float16, torch.bfloat16)
FP8 = torch.float8_e4m3fn  # 3 mantissa bits, up to 448: the format of inference products
FP8_MAX = torch.finfo(FP8).max
# The least scale of a row (an all-zero row of activations keeps a finite scale)
LEAST_SCALE = torch.finfo(torch.float32).tiny


def torch_dense(x, linear, gelu=False, residual=None):
    """`linear(x)`, then GELU or a residual added, as fair-esm's layers do; on CUDA in half
    precision the GELU is the product's own last step (`epilogue_gelu_dense`)."""
    if gelu and x.is_cuda and compute_dtype(x) in HALF:
        return epilogue_gelu_dense(x, linear)
    out = linear(x)
    if gelu:
        out = F.gelu(out)
    return out if residual is None else residual + out


def epilogue_gelu_dense(x, linear):
    """GELU(`linear(x)`) as one product in `x`'s compute dtype (autocast's, where it is on), its
    bias and GELU applied in fp32 to the accumulator before the one rounding to half precision.

    On CUDA this is cuBLASLt's GELU epilogue: no GELU pass over the fc1 output (ESM-2's largest
    activation) through memory. Its GELU is the tanh form, within 4.7e-4 of the exact one (8.5e-5
    on average over N(0, 1) inputs, against a bf16 rounding's 5.6e-4); measured on an H200 it left
    the error to the fp32 forward pass as it was (docs/performance.md). Elsewhere torch applies
    the exact GELU after the product.
    """
    dtype = compute_dtype(x)
    out = torch._addmm_activation(
        linear.bias.to(dtype),
        x.reshape(-1, x.shape[-1]).to(dtype),
        linear.weight.to(dtype).t(),
        use_gelu=True,
    )
    return out.view(*x.shape[:-1], out.shape[-1])


def fp8_rows(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`t` (rows × K) in FP8, each row scaled so that its largest magnitude is FP8's largest,
    and the scales (rows × 1, fp32) that undo it."""
    scale = (t.abs().amax(dim=1, keepdim=True).float() / FP8_MAX).clamp(min=LEAST_SCALE)
    return (t.float() / scale).to(FP8), scale


def to_fp8(linear: torch.nn.Linear) -> None:
    """`linear`'s weight (out × in) replaced by its FP8 values, a scale per output row kept as
    the buffer `weight_scale` (1 × out, as `torch._scaled_mm` takes it); its bias in bf16, the
    product's output dtype."""
    weight, scale = fp8_rows(linear.weight.detach())
    linear.weight = torch.nn.Parameter(weight, requires_grad=False)
    linear.register_buffer("weight_scale", scale.t().contiguous())
    if linear.bias is not None:
        bias = linear.bias.detach().to(torch.bfloat16)
        linear.bias = torch.nn.Parameter(bias, requires_grad=False)


def fp8_dense(x, linear, gelu=False, residual=None):
    """`torch_dense` with `linear` in FP8 (`to_fp8`): `x`'s rows in FP8 too, each with its own
    scale (tokens differ in magnitude by orders), one `torch._scaled_mm` accumulating in fp32
    and rounding once to bf16 with the bias added; GELU and the residual after it, as autocast
    computes them in bf16. A product left out of FP8 (`FastForward.use_fp8`) is `torch_dense`'s."""
    if not hasattr(linear, "weight_scale"):
        return torch_dense(x, linear, gelu, residual)
    rows, scale = fp8_rows(x.reshape(-1, x.shape[-1]))
    # outside autocast, which has nothing to cast here: under the CPU's, torch took another
    # path for the same product, 50-70x slower (and rounding the bias apart)
    with torch.autocast(x.device.type, enabled=False):
        out = torch._scaled_mm(
            rows,
            linear.weight.t(),  # column-major, as the product takes its second operand
            scale_a=scale,
            scale_b=linear.weight_scale,
            bias=linear.bias,
            out_dtype=torch.bfloat16,
        ).view(*x.shape[:-1], linear.weight.shape[0])
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


def compute_dtype(x) -> torch.dtype:
    """The dtype products of `x` come out in: autocast's where it is on, else `x`'s."""
    kind = x.device.type
    return torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else x.dtype


def rotary(inv_freq, length: int, device):
    """cos and sin of each position's angles, 1 × 1 × length × head dim, as `rotate_half` pairs them."""
    t = torch.arange(length, device=device).type_as(inv_freq)
    freqs = torch.outer(t, inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos()[None, None], emb.sin()[None, None]


class Packed(NamedTuple):
    """A batch's sequences laid end to end, no padding: attention stays within each sequence
    and rotary positions restart at each. Token counts are the tokens of each sequence with its
    BOS and EOS.

    Tensors and `longest` only: a compiled layer guards on every Python value it is given where
    its graph breaks (CUDA's varlen attention), and a tuple of the bounds made each batch size a
    graph of its own, then eager code past the compiler's limit of 8."""

    tokens: torch.Tensor  # T token ids
    bounds: torch.Tensor  # B + 1 offsets of the sequences in `tokens` (int32)
    sequence_of: torch.Tensor  # T: the sequence each token belongs to
    positions: torch.Tensor  # T: each token's position in its sequence
    # At least the tokens of the longest sequence: the next power of two (at least 64), an upper
    # bound being all that varlen attention needs. Compiled, each value is a graph of its own.
    longest: int
    # max(B, 2) × the longest sequence's tokens: where each sequence has a token (attention's
    # fallback). Two rows at least (an empty one after a lone sequence): compiled, a batch of
    # one would otherwise be a shape of its own (sizes 0 and 1 are specialised).
    key_mask: torch.Tensor

    @classmethod
    def of(cls, tokens: np.ndarray, counts: np.ndarray, to_device) -> "Packed":
        """From the T token ids and each sequence's token count; `to_device` moves an array."""
        bounds = np.concatenate([[0], np.cumsum(counts)])
        sequence_of = np.repeat(np.arange(len(counts)), counts)
        positions = np.arange(bounds[-1]) - bounds[:-1][sequence_of]
        key_mask = np.zeros((max(len(counts), 2), counts.max()), dtype=bool)
        key_mask[sequence_of, positions] = True
        return cls(
            to_device(tokens),
            to_device(bounds.astype(np.int32)),
            to_device(sequence_of),
            to_device(positions),
            max(64, 1 << int(counts.max() - 1).bit_length()),
            to_device(key_mask),
        )


def varlen_available(q) -> bool:
    """Whether torch's variable-length (flash) attention takes `q`: CUDA, fp16 or bf16."""
    if not q.is_cuda or q.dtype not in (torch.float16, torch.bfloat16):
        return False
    return importlib.util.find_spec("torch.nn.attention.varlen") is not None  # torch >= 2.10


def packed_attention(q, k, v, packed: Packed, scale: float | None = None):
    """Attention of T × heads × head-dim q, k, v within each sequence of `packed`.

    On CUDA in fp16/bf16 one call of torch's variable-length flash attention; elsewhere (CPUs,
    where it is not implemented, and fp32) the sequences' rows are gathered into one padded
    block for one fused attention with the keys masked, and scattered back, so that CPU runs
    check the same packing, offsets and positions.
    """
    if varlen_available(q):
        from torch.nn.attention.varlen import varlen_attn

        # Its default scale, 1/sqrt(head dim), is both families' own: passed only if another is.
        scaled = {} if scale is None or scale == q.shape[-1] ** -0.5 else {"scale": scale}
        longest = packed.longest
        return varlen_attn(q, k, v, packed.bounds, packed.bounds, longest, longest, **scaled)
    where = (packed.sequence_of, packed.positions)

    def padded(t):  # max(B, 2) × H × longest × head dim
        out = t.new_zeros(*packed.key_mask.shape, *t.shape[1:])
        out[where] = t
        return out.transpose(1, 2)

    mask = packed.key_mask[:, None, None, :]
    out = F.scaled_dot_product_attention(
        padded(q), padded(k), padded(v), attn_mask=mask, scale=scale
    )
    return out.transpose(1, 2)[where]


def packed_rotary(inv_freq, packed: Packed):
    """cos and sin of each packed token's angles at its own position, T × 1 × head dim."""
    cos, sin = rotary(inv_freq, packed.longest, packed.tokens.device)
    return cos[0, 0][packed.positions, None], sin[0, 0][packed.positions, None]


class Products(torch.nn.ModuleList):
    """The dense products of one input (q, k and v; a SwiGLU's gate and up), held as the weights'
    files hold them, so that loading maps the files' tensors instead of copying them: one
    Linear each (`split`), or one Linear whose output is theirs laid side by side. `fuse` makes
    them one product (one call instead of several), a copy of their weights where they are."""

    @classmethod
    def of(cls, dim: int, outputs: tuple[int, ...], split: bool, bias: bool) -> "Products":
        sizes = outputs if split else (sum(outputs),)
        return cls(torch.nn.Linear(dim, n, bias=bias) for n in sizes)

    def outputs(self, x, parts: int, dense):
        """The `parts` outputs on `x`."""
        if len(self) == 1:
            return dense(x, self[0]).chunk(parts, dim=-1)
        return [dense(x, linear) for linear in self]

    def fuse(self) -> None:
        if len(self) == 1:
            return
        weight = torch.cat([linear.weight for linear in self])
        fused = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=self[0].bias is not None)
        fused.weight = torch.nn.Parameter(weight, requires_grad=False)
        if fused.bias is not None:
            fused.bias = torch.nn.Parameter(
                torch.cat([linear.bias for linear in self]), requires_grad=False
            )
        for index in range(len(self) - 1, -1, -1):
            del self[index]
        self.append(fused)


class FastForward(torch.nn.Module):
    """A forward pass called as `net(tokens, repr_layers, padded)` (esmshard.models.spec.Family).

    `padded`: whether any token is padding, when the caller knows (asking the device would make
    the host wait for it). A family that `packs` also takes a Packed batch for `tokens`.
    """

    packs = False
    compiles = True  # whether `block` is worth compiling (one graph for every batch's shape)
    compiled_block = None  # `block` compiled (esmshard.compute.compiled), where it is
    fp8 = False  # whether the products of `dense_products` are in FP8 (`use_fp8`)

    def ready(self, device) -> None:
        """Make ready to run once the weights are on `device` (nothing, for most families)."""

    def dense_products(self) -> list[torch.nn.Linear]:
        """The dense products of the repeated layers: what FP8 computes (`use_fp8`). A family
        without FP8 products has none."""
        return []

    def feed_forward_products(self) -> list[torch.nn.Linear]:
        """The feed-forward's share of `dense_products`: the ones FP8 computes within its error
        goals where the attention's do not (docs/performance.md)."""
        return []

    def use_fp8(self, products=None) -> None:
        """The repeated layers' dense products in FP8 from now on (`fp8_dense`): `products`, or
        all of them (`dense_products`); embeddings, norms, attention, the language-model head
        and the products left out stay as autocast computes them."""
        if not self.dense_products():
            raise ValueError(f"precision: fp8 is not offered for {type(self).__name__}")
        for linear in self.dense_products() if products is None else products:
            to_fp8(linear)
        self.fp8 = True

    def dense_for(self, x):
        """`dense_for(x)`, but torch's own product when compiled: its compiler picks the kernels
        (it cannot trace the oneDNN call); in FP8 once `use_fp8` has made them so."""
        if self.fp8:
            return fp8_dense
        return torch_dense if self.compiled_block else dense_for(x)

    def run_block(self, *args):
        """One repeated layer, `block(*args)`: compiled where it has been."""
        return (self.compiled_block or self.block)(*args)
