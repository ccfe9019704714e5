"""ESM-2 weights saved by HuggingFace `transformers` (`config.json` and safetensors files, as
`EsmModel`/`EsmForMaskedLM.save_pretrained` and the hub's facebook/esm2_* hold them) as
fair-esm's ESM2, read from the files alone: `transformers` itself is not needed.

The two hold the same tensors under other names (RENAMES); the rotary frequencies are
recomputed, the pooler and the tied language-model decoder are left out. A config that is no
ESM-2 (ESM-1b's learned positions, ESMFold, another vocabulary) is refused by name.
"""

import json
import re
from pathlib import Path

from .spec import Arch, ModelError
from .weights import (
    mapped_tensors,
    read_config,
    renamed,
    safetensors_files,
    safetensors_tensors,
)

# transformers' name (after the "esm." prefix of the *ForMaskedLM classes) -> fair-esm's.
RENAMES = [
    (r"embeddings\.word_embeddings\.", "embed_tokens."),
    (r"encoder\.layer\.(\d+)\.attention\.self\.query\.", r"layers.\1.self_attn.q_proj."),
    (r"encoder\.layer\.(\d+)\.attention\.self\.key\.", r"layers.\1.self_attn.k_proj."),
    (r"encoder\.layer\.(\d+)\.attention\.self\.value\.", r"layers.\1.self_attn.v_proj."),
    (r"encoder\.layer\.(\d+)\.attention\.output\.dense\.", r"layers.\1.self_attn.out_proj."),
    (r"encoder\.layer\.(\d+)\.attention\.LayerNorm\.", r"layers.\1.self_attn_layer_norm."),
    (r"encoder\.layer\.(\d+)\.intermediate\.dense\.", r"layers.\1.fc1."),
    (r"encoder\.layer\.(\d+)\.output\.dense\.", r"layers.\1.fc2."),
    (r"encoder\.layer\.(\d+)\.LayerNorm\.", r"layers.\1.final_layer_norm."),
    (r"encoder\.emb_layer_norm_after\.", "emb_layer_norm_after."),
    (r"contact_head\.regression\.", "contact_head.regression."),
    (r"lm_head\.(dense|layer_norm)\.", r"lm_head.\1."),
    (r"lm_head\.bias$", "lm_head.bias"),
]
LM_HEAD = "lm_head."
HEAD_DENSE = "lm_head.dense.weight"  # the head's own first tensor (its output is the embeddings')
# Tensors fair-esm's ESM2 has no place for, or computes itself.
IGNORED = re.compile(
    r"(pooler\.|.*rotary_embeddings\.inv_freq$|.*position_ids$|lm_head\.decoder\.)"
)
# What an ESM-2 config must say; the value found otherwise is named in the error.
ESM2_CONFIG = {
    "model_type": "esm",
    "position_embedding_type": "rotary",
    "vocab_size": 33,
    "pad_token_id": 1,
    "mask_token_id": 32,
    "emb_layer_norm_before": False,
    "is_folding_model": False,
    "hidden_act": "gelu",
}


def checked_config(folder: Path) -> dict:
    """The folder's config.json, refused naming the value where it is no ESM-2's."""
    path = Path(folder) / "config.json"
    config = read_config(folder)
    for key, wanted in ESM2_CONFIG.items():
        found = config.get(key, wanted if key in ("is_folding_model", "hidden_act") else None)
        if found != wanted:
            raise ModelError(
                f"{path}: {key} is {json.dumps(found)}, not {json.dumps(wanted)}: not an ESM-2 "
                "model (model_type esm is ESM-2's in esmshard)"
            )
    if config["intermediate_size"] != 4 * config["hidden_size"]:
        raise ModelError(
            f"{path}: intermediate_size {config['intermediate_size']} is not 4 × hidden_size "
            f"{config['hidden_size']}, as ESM-2's is"
        )
    return config


def arch_of(config: dict) -> Arch:
    return Arch(config["num_hidden_layers"], config["hidden_size"], config["num_attention_heads"])


def fair_esm_name(name: str) -> str | None:
    """fair-esm's name for a transformers tensor, None for one fair-esm does without."""
    name = name.removeprefix("esm.")
    # transformers 5 saves layer norms under their old names, gamma and beta.
    name = re.sub(r"LayerNorm\.gamma$", "LayerNorm.weight", name)
    name = re.sub(r"LayerNorm\.beta$", "LayerNorm.bias", name)
    found = renamed(name, RENAMES, IGNORED)
    return found and found[0]


def has_lm_head(folder: Path) -> bool:
    """Whether the folder's weights hold the language-model head (EsmForMaskedLM's do,
    EsmModel's not), read from the files' headers."""
    names = safetensors_tensors(safetensors_files(folder))
    return any(name.split(".", 1)[-1] == HEAD_DENSE or name == HEAD_DENSE for name in names)


def esm2_from_transformers(folder: Path):
    """fair-esm's ESM2 (eval mode, CPU) with the weights of a folder saved by transformers."""
    import torch
    from esm.model.esm2 import ESM2

    config = checked_config(folder)
    layers, dim, heads = arch_of(config)
    with torch.random.fork_rng():  # the language-model head's init, unused, left deterministic
        torch.manual_seed(0)
        model = ESM2(
            num_layers=layers,
            embed_dim=dim,
            attention_heads=heads,
            alphabet="ESM-1b",
            token_dropout=config.get("token_dropout", True),
        )
    state = {}
    for path in safetensors_files(folder):
        for name, tensor in mapped_tensors(path).items():
            try:
                target = fair_esm_name(name)
            except KeyError:
                raise ModelError(
                    f"{path}: tensor {name} has no place in ESM-2; is this an ESM-2 model?"
                ) from None
            if target is not None:
                state[target] = tensor.float()
    missing, _ = model.load_state_dict(state, strict=False)
    # Without its head (EsmModel's files) the model embeds; it scores nothing (score_problems).
    model.has_lm_head = HEAD_DENSE not in missing
    missing = [k for k in missing if not k.startswith(LM_HEAD) and "rot_emb" not in k]
    if missing:
        raise ModelError(
            f"{folder}: the weights lack {missing[0]} (fair-esm's name) and {len(missing) - 1} "
            "more tensors of ESM-2"
        )
    # The config's layer-norm epsilon and rotary base, where they differ from fair-esm's.
    for module in model.modules():
        if isinstance(module, torch.nn.LayerNorm):
            module.eps = config.get("layer_norm_eps", module.eps)
    theta = config.get("rope_theta", 10000.0)
    for layer in model.layers:
        rot = layer.self_attn.rot_emb
        half = torch.arange(0, 2 * rot.inv_freq.numel(), 2, dtype=torch.float32)
        rot.inv_freq.copy_(1.0 / (theta ** (half / (2 * rot.inv_freq.numel()))))
    return model.eval()
