"""A faster ESM-2 forward pass for embeddings, on fair-esm's own weights.

Same arithmetic as fair-esm's `ESM2.forward` (token dropout scaling, rotary embeddings, pre-norm
layers, the final layer norm on the last layer only) with changes that leave the representations
as they were: attention runs through `scaled_dot_product_attention` (fused, with the padded keys
masked) instead of two `bmm`s and a softmax over materialised weights; the language-model and
contact heads are skipped; layers above the highest requested one are not run; on CPUs in fp32
the dense layers run through oneDNN (see `onednn_available`).
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


class FastESM2(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model  # fair-esm's ESM2: its modules and weights, used as they are
        self.num_layers = model.num_layers
        self.embed_dim = model.embed_dim
        self.heads = model.attention_heads
        self.head_dim = model.embed_dim // model.attention_heads

    def rotary(self, length: int, device):
        inv_freq = self.model.layers[0].self_attn.rot_emb.inv_freq  # moves with the model
        t = torch.arange(length, device=device).type_as(inv_freq)
        freqs = torch.einsum("i,j->ij", t, inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos()[None, None], emb.sin()[None, None]

    def attention(self, layer, x, cos, sin, mask, dense):
        attn = layer.self_attn
        batch, length, _ = x.shape

        def heads(t):
            return t.view(batch, length, self.heads, self.head_dim).transpose(1, 2)

        q = heads(dense(x, attn.q_proj))
        k = heads(dense(x, attn.k_proj))
        v = heads(dense(x, attn.v_proj))
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        # fair-esm scales q before rotating it; the rotation is linear, so SDPA may scale instead.
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=attn.scaling)
        return out.transpose(1, 2).reshape(batch, length, self.embed_dim)

    def forward(self, tokens, repr_layers, padded: bool | None = None):
        """`padded`: whether any token is padding, when the caller knows (asking the device
        would make the host wait for it)."""
        m = self.model
        padding = tokens.eq(m.padding_idx)
        x = m.embed_scale * m.embed_tokens(tokens)
        if m.token_dropout:
            masked = tokens == m.mask_idx
            x = x.masked_fill(masked.unsqueeze(-1), 0.0)
            mask_ratio_train = 0.15 * 0.8
            observed = masked.sum(-1).to(x.dtype) / (~padding).sum(-1)
            x = x * (1 - mask_ratio_train) / (1 - observed)[:, None, None]
        x = x * (1 - padding.unsqueeze(-1).type_as(x))

        cpu_fp32 = (
            x.device.type == "cpu"
            and x.dtype == torch.float32
            and not torch.is_autocast_enabled("cpu")
        )
        dense = onednn_dense if cpu_fp32 and onednn_available() else torch_dense

        wanted = set(repr_layers)
        representations = {0: x} if 0 in wanted else {}
        cos, sin = self.rotary(tokens.shape[1], tokens.device)
        # Boolean mask, True where attention is allowed: every query sees the real keys only.
        if padded is None:
            padded = bool(padding.any())
        mask = ~padding[:, None, None, :] if padded else None
        for index, layer in enumerate(m.layers[: max(wanted)]):
            attended = self.attention(layer, layer.self_attn_layer_norm(x), cos, sin, mask, dense)
            x = dense(attended, layer.self_attn.out_proj, residual=x)
            x = dense(
                dense(layer.final_layer_norm(x), layer.fc1, gelu=True), layer.fc2, residual=x
            )
            if index + 1 == self.num_layers:
                x = m.emb_layer_norm_after(x)  # fair-esm normalises the last layer's output only
            if index + 1 in wanted:
                representations[index + 1] = x
        return {"representations": representations}
