"""ESM C weights in the layouts users hold, as esmshard's ESMC names them (esmshard.models.esmc):

- `transformers` (`-hf` repositories, `EsmcModel`/`EsmcForMaskedLM.save_pretrained`): a folder of
  config.json (model_type "esmc") and safetensors files; q/k/v and gate/up are separate tensors.
- EvolutionaryScale's `.pth` files (`esmc_300m_2024_12_v0.pth`, as their `esm` package loads
  them): a state dict with no config; q/k/v and gate/up are each one tensor already.

The heads, which no .pth records, come from the published shapes (esmshard.models.archs). The
language-model head (transformers' `lm_head`, EvolutionaryScale's `sequence_head`: dense, GELU,
LayerNorm, decoder) is read where the files hold it (`include: logits` and the other scores);
classification heads are left out. The functions without `load` in their name read no tensor
data and need no torch, for the workflow's plan.
"""

import re
from pathlib import Path
from typing import NamedTuple

from .archs import ESMC, heads_of
from .spec import Arch, ModelError
from .weights import (
    checkpoint_contents,
    mapped_tensors,
    read_config,
    renamed,
    safetensors_files,
    safetensors_tensors,
)

ROPE_THETA = 10000.0
ESMC_CONFIG = {"model_type": "esmc", "vocab_size": 64, "hidden_act": "silu"}
# transformers' name (after EsmcFor*'s "esmc." prefix) -> esmshard's (q, k, v and gate, up apart).
HF_RENAMES = [
    (r"embed_tokens\.", "embed."),
    (r"layers\.(\d+)\.input_layernorm\.", r"layers.\1.attn_norm."),
    (r"layers\.(\d+)\.self_attn\.q_proj\.", r"layers.\1.attn_in.0."),
    (r"layers\.(\d+)\.self_attn\.k_proj\.", r"layers.\1.attn_in.1."),
    (r"layers\.(\d+)\.self_attn\.v_proj\.", r"layers.\1.attn_in.2."),
    (r"layers\.(\d+)\.self_attn\.q_norm\.", r"layers.\1.q_norm."),
    (r"layers\.(\d+)\.self_attn\.k_norm\.", r"layers.\1.k_norm."),
    (r"layers\.(\d+)\.self_attn\.o_proj\.", r"layers.\1.out_proj."),
    (r"layers\.(\d+)\.post_attention_layernorm\.", r"layers.\1.ffn_norm."),
    (r"layers\.(\d+)\.mlp\.gate_proj\.", r"layers.\1.ffn_in.0."),
    (r"layers\.(\d+)\.mlp\.up_proj\.", r"layers.\1.ffn_in.1."),
    (r"layers\.(\d+)\.mlp\.down_proj\.", r"layers.\1.down."),
    (r"norm\.", "norm."),
    (r"lm_head\.(dense|layer_norm|decoder)\.", r"lm_head.\1."),
]
HF_IGNORED = re.compile(r"(classifier\.|.*inv_freq$)")
# EvolutionaryScale's name -> esmshard's (q, k, v one tensor, and gate, up).
PTH_RENAMES = [
    (r"embed\.", "embed."),
    (r"transformer\.blocks\.(\d+)\.attn\.layernorm_qkv\.0\.", r"layers.\1.attn_norm."),
    (r"transformer\.blocks\.(\d+)\.attn\.layernorm_qkv\.1\.", r"layers.\1.attn_in.0."),
    (r"transformer\.blocks\.(\d+)\.attn\.q_ln\.", r"layers.\1.q_norm."),
    (r"transformer\.blocks\.(\d+)\.attn\.k_ln\.", r"layers.\1.k_norm."),
    (r"transformer\.blocks\.(\d+)\.attn\.out_proj\.", r"layers.\1.out_proj."),
    (r"transformer\.blocks\.(\d+)\.ffn\.0\.", r"layers.\1.ffn_norm."),
    (r"transformer\.blocks\.(\d+)\.ffn\.1\.", r"layers.\1.ffn_in.0."),
    (r"transformer\.blocks\.(\d+)\.ffn\.3\.", r"layers.\1.down."),
    (r"transformer\.norm\.", "norm."),
    (r"sequence_head\.0\.", "lm_head.dense."),
    (r"sequence_head\.2\.", "lm_head.layer_norm."),
    (r"sequence_head\.3\.", "lm_head.decoder."),
]
PTH_IGNORED = re.compile(r".*inv_freq$")
# The language-model head's last tensor in each layout: whether the files hold the head.
HEAD_MARKS = ("lm_head.decoder.weight", "sequence_head.3.weight")
PTH_MARK = "transformer.blocks.0.attn.layernorm_qkv.1.weight"  # what tells an ESM C .pth


class Shape(NamedTuple):
    """All that an ESM C model's shape is."""

    arch: Arch
    ffn: int  # the SwiGLU's hidden size
    rope_theta: float = ROPE_THETA

    @property
    def params(self) -> int:
        """The parameters of its layers (q, k, v, out; gate, up, down): what a token costs."""
        layers, dim, _ = self.arch
        return layers * (4 * dim * dim + 3 * dim * self.ffn)


def ffn_size(dim: int) -> int:
    """The feed-forward's hidden size: 8/3 of the model's, rounded up to a multiple of 256."""
    return int((8 / 3 * dim + 255) // 256 * 256)


def published_params(arch: Arch) -> int:
    """The layers' parameters of a published shape (its feed-forward from its width)."""
    return Shape(arch, ffn_size(arch.dim)).params


def is_hf_config(config: dict | None) -> bool:
    return bool(config) and config.get("model_type") == "esmc"


def is_pth(tensors: dict) -> bool:
    return PTH_MARK in tensors


def hf_shape(folder: Path):
    """The Shape of a transformers folder, from its config.json (refused where it is no ESM C's)."""
    path = Path(folder) / "config.json"
    config = read_config(folder) or {}
    for key, wanted in ESMC_CONFIG.items():
        if config.get(key, wanted) != wanted:
            raise ModelError(f"{path}: {key} is {config.get(key)!r}, not {wanted!r}: not ESM C")
    heads = config["num_attention_heads"]
    if config.get("num_key_value_heads", heads) != heads or config.get("head_dim") not in (
        None,
        config["hidden_size"] // heads,
    ):
        raise ModelError(f"{path}: grouped-query attention or another head size: not ESM C")
    theta = (config.get("rope_parameters") or {}).get("rope_theta", config.get("rope_theta"))
    arch = Arch(config["num_hidden_layers"], config["hidden_size"], heads)
    return Shape(arch, config["intermediate_size"], float(theta or ROPE_THETA))


def pth_shape(path: Path, tensors: dict):
    """The Shape of an EvolutionaryScale .pth, from its tensors' shapes."""
    blocks = {
        int(m.group(1)) for n in tensors if (m := re.match(r"transformer\.blocks\.(\d+)\.", n))
    }
    dim = tensors["embed.weight"].shape[1]
    heads = heads_of(ESMC, len(blocks), dim)
    if heads is None:
        raise ModelError(
            f"{path}: an ESM C .pth of {len(blocks)} layers and dimension {dim}, which is none of "
            f"the published shapes ({', '.join(ESMC)}) (a .pth records no heads); save it with "
            "transformers' EsmcModel instead, whose config.json says them"
        )
    ffn = tensors["transformer.blocks.0.ffn.3.weight"].shape[1]
    return Shape(Arch(len(blocks), dim, heads), ffn)


def shape_of(path: Path):
    """The Shape of ESM C weights in either layout (a folder, or a .pth file)."""
    path = Path(path)
    if path.is_dir():
        return hf_shape(path)
    return pth_shape(path, checkpoint_contents(path))


def has_lm_head(path: Path) -> bool:
    """Whether the files hold the language-model head (EsmcForMaskedLM's and the .pth files
    do, EsmcModel's not), read from their headers."""
    path = Path(path)
    if path.is_dir():
        names = safetensors_tensors(safetensors_files(path))
    else:
        names = checkpoint_contents(path)
    return any(name.removeprefix("esmc.") in HEAD_MARKS for name in names)


def read_weights(path: Path):
    """(Shape, whether q, k, v are apart, the state dict as esmshard's ESMC names it), every
    tensor the file's own, memory-mapped, in the file's dtype (nothing read until used)."""
    path = Path(path)
    shape = shape_of(path)
    state = {}
    if path.is_dir():
        sources = [(f, mapped_tensors(f)) for f in safetensors_files(path)]
        renames, ignored = HF_RENAMES, HF_IGNORED
    else:
        sources = [(path, mapped_tensors(path))]
        renames, ignored = PTH_RENAMES, PTH_IGNORED
    for source, tensors in sources:
        for name, tensor in tensors.items():
            try:
                target = renamed(name.removeprefix("esmc."), renames, ignored)
            except KeyError:
                raise ModelError(
                    f"{source}: tensor {name} has no place in ESM C; is this an ESM C model?"
                ) from None
            if target is not None:
                state[target[0]] = tensor
    return shape, path.is_dir(), state
