"""ESM-2 (fair-esm's model and weights): loading fair-esm checkpoints from its hub or a file,
folders saved by transformers (esmshard.models.esm2_hf), random weights; and a faster forward
pass for embeddings over fair-esm's own modules (FastESM2).

FastESM2 does the arithmetic of fair-esm's `ESM2.forward` (token dropout scaling, rotary
embeddings, pre-norm layers, the final layer norm on the last layer only) with changes that leave
the representations as they were: attention runs through `scaled_dot_product_attention` (fused,
with the padded keys masked) instead of two `bmm`s and a softmax over materialised weights; the
language-model and contact heads are skipped; layers above the highest requested one are not run;
on CPUs in fp32 the dense layers run through oneDNN (esmshard.models.layers). fair-esm's ESM-1b
layout (ESM-1b, ESM-1v: esmshard.models.esm1) has the same layers: FastESM2 runs it too, with
its learned absolute positions (added to the embeddings, then its layer norm before the layers)
instead of rotary ones.
"""

import argparse
from pathlib import Path

import torch
import torch.nn.functional as F

from .archs import ESM2 as ARCHS
from .esm2_files import PREFIXES, ensure_available, hub_paths, regression_path
from .layers import (
    FastForward,
    Packed,
    compute_dtype,
    packed_attention,
    packed_rotary,
    rotary,
    rotate_half,
)
from .spec import RANDOM_SEED, Arch, ModelSpec, take_weights
from .weights import on_meta, safe_load


def random_model(name: str):
    """The ESM-2 architecture `name` with seeded random weights (tests and benchmarks only)."""
    from esm.model.esm2 import ESM2

    layers, dim, heads = ARCHS[name]
    with torch.random.fork_rng():
        torch.manual_seed(RANDOM_SEED)
        return ESM2(num_layers=layers, embed_dim=dim, attention_heads=heads, alphabet="ESM-1b")


def load(spec: ModelSpec):
    """(fair-esm's ESM2 in eval mode on the CPU, its alphabet)."""
    if spec.kind == "random":
        model = random_model(spec.name)
    elif spec.kind in ("hf", "folder"):
        from .esm2_hf import esm2_from_transformers

        model = esm2_from_transformers(spec.path)
    else:
        ensure_available(spec)
        model = load_checkpoint(spec.path if spec.kind == "local" else hub_paths(spec.name)[0])
    return model.eval(), model.alphabet


def load_checkpoint(path: Path):
    """fair-esm's ESM2 from its checkpoint and contact-regression file, as fair-esm's loader
    builds it, without two copies of the weights in memory: the tensors are memory-mapped from
    the file, the model is built without storage (torch's meta device) and takes the file's
    tensors as its own. The 15B model's 60 GB checkpoint then needs no more host memory than
    the pages in use. Names with either of fair-esm's prefixes are taken, as fair-esm does."""
    import esm
    from esm.model.esm2 import ESM2

    data = safe_load(path, mmap=True)
    state = {}
    for name, tensor in {**data["model"], **safe_load(regression_path(path))["model"]}.items():
        prefix = next((p for p in PREFIXES if name.startswith(p)), "")
        state[name[len(prefix) :]] = tensor
    cfg = data["cfg"]["model"]
    with on_meta():
        model = ESM2(
            num_layers=cfg.encoder_layers,
            embed_dim=cfg.encoder_embed_dim,
            attention_heads=cfg.encoder_attention_heads,
            alphabet=esm.data.Alphabet.from_architecture("ESM-1b"),
            token_dropout=cfg.token_dropout,
        )
    take_weights(
        model,
        state,
        path,
        "ESM-2",
        Arch(cfg.encoder_layers, cfg.encoder_embed_dim, cfg.encoder_attention_heads),
    )
    return model


def write_checkpoint(model, directory: Path, name: str) -> Path:
    """Save `model` in fair-esm's on-disk format: `<name>.pt` plus its contact-regression file."""
    directory.mkdir(parents=True, exist_ok=True)
    state = model.state_dict()
    regression_keys = [k for k in state if k.startswith("contact_head.regression.")]
    body = {
        f"encoder.sentence_encoder.{k}": v for k, v in state.items() if k not in regression_keys
    }
    cfg = argparse.Namespace(
        encoder_layers=model.num_layers,
        encoder_embed_dim=model.embed_dim,
        encoder_ffn_embed_dim=4 * model.embed_dim,
        encoder_attention_heads=model.attention_heads,
        token_dropout=model.token_dropout,
        arch="esm2",
    )
    path = directory / f"{name}.pt"
    torch.save({"model": body, "cfg": {"model": cfg}}, path)
    torch.save({"model": {k: state[k] for k in regression_keys}}, regression_path(path))
    return path


def fuse_qkv(attn) -> torch.nn.Linear:
    """One D → 3·D product for fair-esm's q, k and v projections of `attn`: their weights become
    views of the fused one (no second copy in memory; fair-esm's own forward pass still works)."""
    weight = attn.q_proj.weight
    fused = torch.nn.Linear(
        attn.embed_dim, 3 * attn.embed_dim, device=weight.device, dtype=weight.dtype
    )
    projections = (attn.q_proj, attn.k_proj, attn.v_proj)
    with torch.no_grad():
        fused.weight.copy_(torch.cat([p.weight for p in projections]))
        fused.bias.copy_(torch.cat([p.bias for p in projections]))
    fused.requires_grad_(False)
    for p, weight, bias in zip(projections, fused.weight.chunk(3), fused.bias.chunk(3)):
        p.weight, p.bias = torch.nn.Parameter(weight, False), torch.nn.Parameter(bias, False)
    return fused


class FastESM2(FastForward):
    packs = True

    @staticmethod
    def takes(model) -> bool:
        """Whether `model` is fair-esm's ESM-2, or its ESM-1b layout (ESM-1b, ESM-1v): the same
        layers, with learned positions instead of rotary ones."""
        from esm.model.esm1 import ProteinBertModel
        from esm.model.esm2 import ESM2

        if isinstance(model, ProteinBertModel):
            return model.model_version == "ESM-1b"
        return isinstance(model, ESM2)

    def __init__(self, model):
        super().__init__()
        self.model = model  # fair-esm's ESM2 or ProteinBertModel: its modules, used as they are
        self.num_layers = model.num_layers
        self.embed_dim = model.embed_dim
        self.attention_heads = model.attention_heads
        self.head_dim = model.embed_dim // model.attention_heads
        self.qkv = torch.nn.ModuleList(fuse_qkv(layer.self_attn) for layer in model.layers)
        # ESM-1b's: learned absolute positions, and a layer norm before the first layer
        self.learned_positions = getattr(model, "embed_positions", None)
        self.token_dropout = getattr(model, "token_dropout", None)
        if self.token_dropout is None:  # ESM-1b keeps it in its config
            self.token_dropout = getattr(model.args, "token_dropout", False)

    def dense_products(self) -> list[torch.nn.Linear]:
        return [
            linear
            for qkv, layer in zip(self.qkv, self.model.layers)
            for linear in (qkv, layer.self_attn.out_proj, layer.fc1, layer.fc2)
        ]

    def feed_forward_products(self) -> list[torch.nn.Linear]:
        return [linear for layer in self.model.layers for linear in (layer.fc1, layer.fc2)]

    def attention(self, attn, qkv, x, cos, sin, mask, dense):
        """Self-attention `attn` on `x`: B × L × D with `mask`, or T × D packed (`mask` a Packed)."""
        shape = x.shape

        def heads(t):  # B × H × L × head dim; packed: T × H × head dim
            t = t.view(*shape[:-1], self.attention_heads, self.head_dim)
            return t if packed else t.transpose(1, 2)

        packed = isinstance(mask, Packed)
        q, k, v = (heads(t) for t in dense(x, qkv).chunk(3, dim=-1))
        if cos is not None:  # rotary positions (ESM-2's)
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
        # fair-esm scales q before rotating it; the rotation is linear, so SDPA may scale instead.
        if packed:
            return packed_attention(q, k, v, mask, attn.scaling).reshape(shape)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=attn.scaling)
        return out.transpose(1, 2).reshape(shape)

    def block(self, layer, qkv, x, cos, sin, mask, dense):
        """fair-esm's TransformerLayer `layer` (q, k and v as the one product `qkv`) on `x`.

        Its modules come in as arguments, not as an index: compiled (esmshard.compute.compiled),
        one graph then serves every layer."""
        attn = layer.self_attn
        attended = self.attention(attn, qkv, layer.self_attn_layer_norm(x), cos, sin, mask, dense)
        x = dense(attended, attn.out_proj, residual=x)
        return dense(dense(layer.final_layer_norm(x), layer.fc1, gelu=True), layer.fc2, residual=x)

    def positions(self, packed: Packed | None, padding):
        """Each token's row of ESM-1b's learned positions, as fair-esm numbers them: the
        padding index plus the token's place in its sequence from 1 (padding: the padding
        index's own row)."""
        first = self.model.padding_idx + 1
        if packed:
            return packed.positions + first
        real = (~padding).long()
        return torch.cumsum(real, dim=1) * real + self.model.padding_idx

    def forward(self, tokens, repr_layers, padded: bool | None = None):
        """Representations of padded `tokens` (B × L), or of a Packed batch (T × D each)."""
        m = self.model
        packed = tokens if isinstance(tokens, Packed) else None
        if packed:
            tokens = packed.tokens
        padding = tokens.eq(m.padding_idx)
        x = m.embed_scale * m.embed_tokens(tokens)
        if self.token_dropout:
            masked = tokens == m.mask_idx
            x = x.masked_fill(masked.unsqueeze(-1), 0.0)
            mask_ratio_train = 0.15 * 0.8
            if packed:  # each sequence's share of <mask> tokens, BOS and EOS counted
                n = packed.bounds.shape[0] - 1
                count = torch.zeros(n, device=x.device, dtype=x.dtype)
                count.index_add_(0, packed.sequence_of, masked.to(x.dtype))
                observed = (count / packed.bounds.diff())[packed.sequence_of, None]
            else:
                observed = (masked.sum(-1).to(x.dtype) / (~padding).sum(-1))[:, None, None]
            x = x * (1 - mask_ratio_train) / (1 - observed)
        if self.learned_positions is not None:
            x = x + self.learned_positions.weight[self.positions(packed, padding)]
            if m.emb_layer_norm_before is not None:
                x = m.emb_layer_norm_before(x)
        if not packed:
            x = x * (1 - padding.unsqueeze(-1).type_as(x))
        dense = self.dense_for(x)

        wanted = set(repr_layers)
        representations = {0: x} if 0 in wanted else {}
        cos = sin = None  # ESM-1b's positions are in x already
        mask = packed
        if self.learned_positions is None:
            # The inverse frequencies move with the model.
            inv_freq = m.layers[0].self_attn.rot_emb.inv_freq
            if packed:
                cos, sin = packed_rotary(inv_freq, packed)
            else:
                cos, sin = rotary(inv_freq, tokens.shape[1], tokens.device)
            # In the dtype q and k are computed in: fp32 tables would promote them (under
            # autocast the products are half precision), and varlen attention takes half
            # precision only.
            cos, sin = (t.to(compute_dtype(x)) for t in (cos, sin))
        if not packed:
            # Boolean mask, True where attention is allowed: every query sees the real keys only.
            if padded is None:
                padded = bool(padding.any())
            mask = ~padding[:, None, None, :] if padded else None
        for index, layer in enumerate(m.layers[: max(wanted)]):
            x = self.run_block(layer, self.qkv[index], x, cos, sin, mask, dense)
            if index + 1 == self.num_layers:
                x = m.emb_layer_norm_after(x)  # fair-esm normalises the last layer's output only
            if index + 1 in wanted:
                representations[index + 1] = x
        return {"representations": representations}
