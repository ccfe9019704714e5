"""T5 encoders (ProtT5, Ankh), in esmshard's own module, with transformers' `T5EncoderModel`
arithmetic: token embeddings and no absolute positions; in each layer x + o(attention(norm(x)))
then x + ffn(norm(x)), T5's norm a root mean square without mean or bias, computed in fp32; the
attention logits unscaled, plus a learned bias per head for the bucket of each key's position
relative to the query's (one table, the first layer's, for every layer); the feed-forward
relu(wi x) (ProtT5) or gelu_tanh(wi_0 x) · wi_1 x (Ankh); a final norm. Layer 0 is the token
embeddings, layer k the output of layer k, and the last layer is after the final norm
(transformers' `last_hidden_state`). Batches are padded: the position bias and the padded keys
are one additive mask. Weights and tokenizer are read by esmshard.models.t5_files and
esmshard.models.t5_tokenizer; the decoder of a full T5 is never loaded.
"""

import math

import torch
import torch.nn.functional as F

from .layers import FastForward
from .spec import ModelSpec, take_weights
from .t5_files import Shape, read_weights, shape_of
from .t5_tokenizer import alphabet
from .weights import on_meta


class RMSNorm(torch.nn.Module):
    """T5's LayerNorm: x / sqrt(mean(x²) + eps) · weight, in fp32."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        x = x.float()
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


class Block(torch.nn.Module):
    def __init__(self, shape: Shape):
        super().__init__()
        dim, inner = shape.arch.dim, shape.arch.heads * shape.head_dim
        self.attn_norm = RMSNorm(dim, shape.eps)
        self.qkv = torch.nn.Linear(dim, 3 * inner, bias=False)
        self.out = torch.nn.Linear(inner, dim, bias=False)
        self.ffn_norm = RMSNorm(dim, shape.eps)
        # gated: wi_0's rows (through the activation), then wi_1's
        self.wi = torch.nn.Linear(dim, (2 if shape.variant.gated else 1) * shape.ffn, bias=False)
        self.wo = torch.nn.Linear(shape.ffn, dim, bias=False)


def relative_buckets(length: int, buckets: int, max_distance: int, device) -> torch.Tensor:
    """L × L: the bucket of key j's position relative to query i's, T5's bidirectional scheme
    (half the buckets for keys after the query; exact up to a quarter of them, then
    logarithmic up to `max_distance`, beyond which all share the last)."""
    position = torch.arange(length, device=device)
    relative = position[None, :] - position[:, None]
    half = buckets // 2
    exact = half // 2
    distance = relative.abs()
    logarithmic = (
        exact
        + (
            torch.log(distance.float() / exact) / math.log(max_distance / exact) * (half - exact)
        ).long()
    )
    logarithmic = logarithmic.clamp(max=half - 1)
    return (relative > 0).long() * half + torch.where(distance < exact, distance, logarithmic)


class T5Encoder(FastForward):
    # Its attention mask's last size is each batch's length: compiled, a graph for every length.
    compiles = False

    def __init__(self, shape: Shape, padding_idx: int):
        super().__init__()
        self.shape = shape
        self.padding_idx = padding_idx
        self.num_layers, self.embed_dim, self.attention_heads = shape.arch
        self.head_dim = shape.head_dim
        self.embed = torch.nn.Embedding(shape.vocab, self.embed_dim)
        self.position_bias = torch.nn.Embedding(shape.buckets, self.attention_heads)
        self.layers = torch.nn.ModuleList(Block(shape) for _ in range(self.num_layers))
        self.norm = RMSNorm(self.embed_dim, shape.eps)
        inner = self.attention_heads * self.head_dim
        # Activations per token (esmshard.compute.batching.auto_token_budget): the residual
        # and norms, q, k, v and the attention's output, the feed-forward's hidden values.
        self.activation_values = 4 * self.embed_dim + 4 * inner + 3 * shape.ffn

    def relative_bias(self, length: int, device) -> torch.Tensor:
        """1 × heads × L × L, added to the attention logits of every layer."""
        shape = self.shape
        buckets = relative_buckets(length, shape.buckets, shape.max_distance, device)
        return self.position_bias(buckets).permute(2, 0, 1)[None]

    def block(self, layer, x, mask, dense):
        """Layer `layer` on `x` (B × L × D), `mask` the additive attention mask."""
        batch, length, _ = x.shape
        q, k, v = dense(layer.attn_norm(x), layer.qkv).chunk(3, dim=-1)

        def heads(t):  # B × H × L × head dim
            return t.reshape(batch, length, self.attention_heads, self.head_dim).transpose(1, 2)

        out = F.scaled_dot_product_attention(
            heads(q), heads(k), heads(v), attn_mask=mask.to(v.dtype), scale=1.0
        )
        x = dense(out.transpose(1, 2).reshape(batch, length, -1), layer.out, residual=x)
        hidden = dense(layer.ffn_norm(x), layer.wi)
        if self.shape.variant.gated:
            gate, up = hidden.chunk(2, dim=-1)
            hidden = F.gelu(gate, approximate="tanh") * up
        else:
            hidden = F.relu(hidden)
        return dense(hidden, layer.wo, residual=x)

    def forward(self, tokens, repr_layers, padded: bool | None = None):
        """Representations of padded `tokens` (B × L): residues, </s>, padding."""
        x = self.embed(tokens)
        dense = self.dense_for(x)
        wanted = set(repr_layers)
        representations = {0: x} if 0 in wanted else {}
        mask = self.relative_bias(tokens.shape[1], tokens.device)
        padding = tokens.eq(self.padding_idx)
        if padded is None:
            padded = bool(padding.any())
        if padded:
            mask = mask.masked_fill(padding[:, None, None, :], float("-inf"))
        for index, layer in enumerate(self.layers[: max(wanted)]):
            x = self.run_block(layer, x, mask, dense)
            if index + 1 == self.num_layers:
                x = self.norm(x)
            if index + 1 in wanted:
                representations[index + 1] = x
        return {"representations": representations}


def load(spec: ModelSpec):
    """(T5Encoder in eval mode on the CPU, its alphabet), the weights taken as read (no copy)."""
    shape = shape_of(spec.path)
    residues = alphabet(spec.path, shape.variant)
    state = read_weights(spec.path, shape)
    with on_meta():
        model = T5Encoder(shape, residues.padding_idx)
    take_weights(model, state, spec.path, "T5 encoder", shape.arch)
    return model.eval(), residues
