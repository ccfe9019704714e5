"""BERT encoders (ProtBert, ProtBert-BFD), in esmshard's own module, with transformers'
`BertModel` arithmetic: token, absolute position and token-type (all 0) embeddings, summed and
normalised; in each layer LayerNorm(x + out(attention(x))), then LayerNorm(x + ffn(x)) with an
exact GELU between the feed-forward's two products (post-norm: no final norm). Layer 0 is the
normalised embeddings, layer k the output of layer k (transformers' `hidden_states[k]`). The
forward pass is esmshard's fast one (fused attention over the real keys, oneDNN on CPUs in fp32,
only the layers needed) on padded batches: positions count from each sequence's `[CLS]`.
Weights and vocabulary are read by esmshard.models.bert_files.
"""

import torch
import torch.nn.functional as F

from .bert_files import Shape, alphabet, read_weights, shape_of
from .layers import FastForward, Products
from .spec import ModelSpec, take_weights
from .weights import on_meta


class Block(torch.nn.Module):
    def __init__(self, dim: int, ffn: int, eps: float):
        super().__init__()
        self.attn_in = Products.of(dim, (dim, dim, dim), split=True, bias=True)  # q, k, v
        self.attn_out = torch.nn.Linear(dim, dim)
        self.attn_norm = torch.nn.LayerNorm(dim, eps=eps)
        self.ffn_in = torch.nn.Linear(dim, ffn)
        self.ffn_out = torch.nn.Linear(ffn, dim)
        self.ffn_norm = torch.nn.LayerNorm(dim, eps=eps)


class ProtBert(FastForward):
    compiles = False  # not measured on a GPU yet

    def __init__(self, shape: Shape, padding_idx: int):
        super().__init__()
        self.num_layers, self.embed_dim, self.attention_heads = shape.arch
        self.head_dim = self.embed_dim // self.attention_heads
        self.word = torch.nn.Embedding(shape.vocab, self.embed_dim)
        self.position = torch.nn.Embedding(shape.positions, self.embed_dim)
        self.token_type = torch.nn.Embedding(shape.token_types, self.embed_dim)
        self.embed_norm = torch.nn.LayerNorm(self.embed_dim, eps=shape.eps)
        self.layers = torch.nn.ModuleList(
            Block(self.embed_dim, shape.ffn, shape.eps) for _ in range(self.num_layers)
        )
        self.padding_idx = padding_idx

    def ready(self, device) -> None:
        """On a GPU, q, k and v as one product (a copy made there, not in host memory)."""
        if device.type == "cuda":
            for block in self.layers:
                block.attn_in.fuse()

    def attention(self, block, x, mask, dense):
        q, k, v = block.attn_in.outputs(x, 3, dense)

        def heads(t):  # B × H × L × head dim
            return t.reshape(*x.shape[:-1], self.attention_heads, self.head_dim).transpose(1, 2)

        out = F.scaled_dot_product_attention(heads(q), heads(k), heads(v), attn_mask=mask)
        return out.transpose(1, 2).reshape(x.shape)

    def block(self, block, x, mask, dense):
        """Layer `block` on `x` (B × L × D)."""
        x = block.attn_norm(
            dense(self.attention(block, x, mask, dense), block.attn_out, residual=x)
        )
        inner = dense(x, block.ffn_in, gelu=True)
        return block.ffn_norm(dense(inner, block.ffn_out, residual=x))

    def forward(self, tokens, repr_layers, padded: bool | None = None):
        """Representations of padded `tokens` (B × L)."""
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.word(tokens) + self.token_type.weight[0]
        x = self.embed_norm(x + self.position(positions))
        dense = self.dense_for(x)
        wanted = set(repr_layers)
        representations = {0: x} if 0 in wanted else {}
        padding = tokens.eq(self.padding_idx)
        if padded is None:
            padded = bool(padding.any())
        mask = ~padding[:, None, None, :] if padded else None  # True: the key is real
        for index, block in enumerate(self.layers[: max(wanted)]):
            x = self.run_block(block, x, mask, dense)
            if index + 1 in wanted:
                representations[index + 1] = x
        return {"representations": representations}


def load(spec: ModelSpec):
    """(ProtBert in eval mode on the CPU, its alphabet), the files' tensors taken as mapped."""
    shape = shape_of(spec.path)
    residues = alphabet(spec.path)
    with on_meta():
        model = ProtBert(shape, residues.padding_idx)
    take_weights(model, read_weights(spec.path), spec.path, "BERT encoder", shape.arch)
    return model.eval(), residues
