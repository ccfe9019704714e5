"""ESM C (ESM Cambrian), in esmshard's own module: EvolutionaryScale's `esm` package is not used
(it installs a top-level `esm` module, as fair-esm does, and pins an older torch).

Its layers differ from ESM-2's: no biases in the projections, LayerNorm over the queries and the
keys (QK-norm, bias-free), a SwiGLU feed-forward, each residual branch divided by
sqrt(layers / 36), a bias-free final LayerNorm, no token dropout. Rotary embeddings and the
vocabulary are ESM-2's (one token differs: 31 is the chain break `|`). The forward pass is
esmshard's fast one (fused attention over the real keys, oneDNN on CPUs in fp32, only the layers
needed), with transformers' `EsmcModel` arithmetic: layer 0 is the token embeddings, layer k the
output of block k, and the last layer is after the final norm (transformers' `hidden_states[-1]`).
Weights are read by esmshard.models.esmc_weights.
"""

import math

import torch
import torch.nn.functional as F

from .archs import ESMC as ARCHS
from .esmc_weights import Shape, ffn_size, read_weights
from .layers import (
    FastForward,
    Packed,
    Products,
    packed_attention,
    packed_rotary,
    rotary,
    rotate_half,
)
from .spec import RANDOM_SEED, Alphabet, ModelSpec, take_weights
from .weights import on_meta

VOCABULARY = (
    "<cls> <pad> <eos> <unk> L A G V S E R T I D P K Q N F Y M H W C X B U Z O . - | <mask>"
).split()
VOCAB_SIZE = 64  # the embedding's rows: the vocabulary, padded
NORM_EPS = 1e-5


ALPHABET = Alphabet(
    {token: index for index, token in enumerate(VOCABULARY)},
    VOCABULARY.index("<pad>"),
    VOCABULARY.index("<cls>"),
    VOCABULARY.index("<eos>"),
    VOCABULARY.index("<mask>"),
)


class Block(torch.nn.Module):
    """One ESM C layer; its q, k, v and gate, up Products as the weights' files hold them."""

    def __init__(self, dim: int, ffn: int, split: bool):
        super().__init__()
        self.attn_norm = torch.nn.LayerNorm(dim, eps=NORM_EPS)
        self.attn_in = Products.of(dim, (dim, dim, dim), split, bias=False)  # q, k, v
        self.q_norm = torch.nn.LayerNorm(dim, eps=NORM_EPS, bias=False)
        self.k_norm = torch.nn.LayerNorm(dim, eps=NORM_EPS, bias=False)
        self.out_proj = torch.nn.Linear(dim, dim, bias=False)
        self.ffn_norm = torch.nn.LayerNorm(dim, eps=NORM_EPS)
        self.ffn_in = Products.of(dim, (ffn, ffn), split, bias=False)  # gate, then up
        self.down = torch.nn.Linear(ffn, dim, bias=False)


class LMHead(torch.nn.Module):
    """The language-model head over the last layer (after the final norm): dense, GELU,
    LayerNorm, then the vocabulary's logits, as transformers' EsmcMaskedLMHead and
    EvolutionaryScale's sequence_head compute them."""

    def __init__(self, dim: int):
        super().__init__()
        self.dense = torch.nn.Linear(dim, dim)
        self.layer_norm = torch.nn.LayerNorm(dim)
        self.decoder = torch.nn.Linear(dim, VOCAB_SIZE)

    def forward(self, x):
        return self.decoder(self.layer_norm(F.gelu(self.dense(x))))


class ESMC(FastForward):
    packs = True

    def __init__(self, shape: Shape, split: bool = False, head: bool = True):
        super().__init__()
        (self.num_layers, self.embed_dim, self.attention_heads), ffn, _ = shape
        self.head_dim = self.embed_dim // self.attention_heads
        self.residual_scale = math.sqrt(self.num_layers / 36)
        self.embed = torch.nn.Embedding(VOCAB_SIZE, self.embed_dim)
        self.layers = torch.nn.ModuleList(
            Block(self.embed_dim, ffn, split) for _ in range(self.num_layers)
        )
        self.norm = torch.nn.LayerNorm(self.embed_dim, eps=NORM_EPS, bias=False)
        # where the files hold it (the scores: esmshard.compute.embedder)
        self.lm_head = LMHead(self.embed_dim) if head else None
        self.register_buffer("inv_freq", self.rotary_frequencies(shape), persistent=False)
        self.padding_idx = ALPHABET.padding_idx

    def rotary_frequencies(self, shape: Shape):
        """The rotary embedding's frequencies (no file holds them), on the CPU."""
        half = torch.arange(0, self.head_dim, 2, dtype=torch.float32, device="cpu")
        return 1.0 / shape.rope_theta ** (half / self.head_dim)

    def ready(self, device) -> None:
        """On a GPU, each block's input products as one (a copy made there, not in host memory)."""
        if device.type == "cuda":
            for block in self.layers:
                block.attn_in.fuse()
                block.ffn_in.fuse()

    def dense_products(self) -> list[torch.nn.Linear]:
        return [
            linear
            for block in self.layers
            for linear in (*block.attn_in, block.out_proj, *block.ffn_in, block.down)
        ]

    def feed_forward_products(self) -> list[torch.nn.Linear]:
        return [linear for block in self.layers for linear in (*block.ffn_in, block.down)]

    def residual(self, x, out, dense, linear):
        """x + linear(out) / residual_scale; one fused call where the scale is 1 (the 600M)."""
        if self.residual_scale == 1:
            return dense(out, linear, residual=x)
        return x + dense(out, linear) / self.residual_scale

    def attention(self, block, x, cos, sin, mask, dense):
        """Self-attention of `x`: B × L × D with `mask`, or T × D packed (`mask` a Packed)."""
        shape, packed = x.shape, isinstance(mask, Packed)
        q, k, v = block.attn_in.outputs(block.attn_norm(x), 3, dense)
        # Under autocast the norms compute in fp32; the attention takes one dtype.
        q, k = block.q_norm(q).to(v.dtype), block.k_norm(k).to(v.dtype)

        def heads(t):  # B × H × L × head dim; packed: T × H × head dim
            t = t.reshape(*shape[:-1], self.attention_heads, self.head_dim)
            return t if packed else t.transpose(1, 2)

        q, k, v = heads(q), heads(k), heads(v)
        q = (q * cos + rotate_half(q) * sin).to(v.dtype)
        k = (k * cos + rotate_half(k) * sin).to(v.dtype)
        if packed:
            return packed_attention(q, k, v, mask).reshape(shape)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return out.transpose(1, 2).reshape(shape)

    def block(self, block, x, cos, sin, mask, dense):
        """Block `block` on `x`. The block comes in as an argument, not as an index: compiled
        (esmshard.compute.compiled), one graph then serves every layer."""
        x = self.residual(
            x, self.attention(block, x, cos, sin, mask, dense), dense, block.out_proj
        )
        gate, up = block.ffn_in.outputs(block.ffn_norm(x), 2, dense)
        return self.residual(x, F.silu(gate) * up, dense, block.down)

    def forward(self, tokens, repr_layers, padded: bool | None = None):
        """Representations of padded `tokens` (B × L), or of a Packed batch (T × D each)."""
        packed = tokens if isinstance(tokens, Packed) else None
        x = self.embed(packed.tokens if packed else tokens)
        dense = self.dense_for(x)
        wanted = set(repr_layers)
        representations = {0: x} if 0 in wanted else {}
        if packed:
            (cos, sin), mask = packed_rotary(self.inv_freq, packed), packed
        else:
            cos, sin = rotary(self.inv_freq, tokens.shape[1], tokens.device)
            padding = tokens.eq(self.padding_idx)
            if padded is None:
                padded = bool(padding.any())
            mask = ~padding[:, None, None, :] if padded else None  # True: the key is real
        for index, block in enumerate(self.layers[: max(wanted)]):
            x = self.run_block(block, x, cos, sin, mask, dense)
            if index + 1 == self.num_layers:
                x = self.norm(x)
            if index + 1 in wanted:
                representations[index + 1] = x
        return {"representations": representations}


def random_model(name: str) -> ESMC:
    """The ESM C architecture `name` with seeded random weights (tests and benchmarks only)."""
    arch = ARCHS[name]
    with torch.random.fork_rng():
        torch.manual_seed(RANDOM_SEED)
        model = ESMC(Shape(arch, ffn_size(arch.dim)))
        for module in model.modules():  # LayerNorms start at 1 and 0: perturb them too
            if isinstance(module, torch.nn.LayerNorm):
                torch.nn.init.normal_(module.weight, 1.0, 0.1)
                if module.bias is not None:
                    torch.nn.init.normal_(module.bias, 0.0, 0.1)
    return model


def load(spec: ModelSpec):
    """(ESMC in eval mode on the CPU, its alphabet). The weights are the files' own tensors,
    memory-mapped and in the files' dtype, taken by a model built without storage (torch's meta
    device): loading the 6B model adds none of its size to host memory (the Embedder moves and
    casts them, esmshard.compute.placement.placed)."""
    if spec.kind == "random":
        return random_model(spec.name).eval(), ALPHABET
    shape, split, state = read_weights(spec.path)
    with on_meta():
        model = ESMC(shape, split, head=any(name.startswith("lm_head.") for name in state))
    take_weights(model, state, spec.path, "ESM C", shape.arch)
    return model.eval(), ALPHABET
