"""T5 encoders' folders (ProtT5, Ankh), as transformers saves them and their authors publish them:
config.json of model_type "t5", the weights (.safetensors files, or the pytorch_model.bin that
ProtT5's repositories hold), and the tokenizer the folder ships (tokenizer.json, else
sentencepiece's spiece.model; esmshard.models.t5_tokenizer reads it).

Only the encoder is read: a T5ForConditionalGeneration folder's decoder and language-model head
are skipped, never loaded. The variant (ProtT5 or Ankh) is the config's `feed_forward_proj`.
Nothing here imports torch but `read_weights`, for the workflow's plan.
"""

import re
from pathlib import Path
from typing import NamedTuple

from .spec import Arch, ModelError
from .weights import folder_weight_files, mapped_tensors, read_config, renamed

TOKENIZER_FILES = ("tokenizer.json", "spiece.model")  # the first one a folder has is read


class Variant(NamedTuple):
    """What a T5 encoder's `feed_forward_proj` says about it."""

    title: str
    gated: bool  # feed-forward act(wi_0 x) · wi_1 x, else act(wi x)
    activation: str  # transformers' `dense_act_fn`
    rare_as_x: bool  # U, Z, O and B are read as X, as its authors' examples do


VARIANTS = {
    "relu": Variant("ProtT5", gated=False, activation="relu", rare_as_x=True),
    "gated-gelu": Variant("Ankh", gated=True, activation="gelu_new", rare_as_x=False),
}


class Shape(NamedTuple):
    """All that a T5 encoder's shape is."""

    arch: Arch  # encoder layers, d_model, heads
    head_dim: int  # d_kv: heads × d_kv need not be d_model
    ffn: int  # d_ff
    feed_forward: str  # a key of VARIANTS
    buckets: int  # relative_attention_num_buckets
    max_distance: int  # relative_attention_max_distance
    eps: float
    vocab: int

    @property
    def variant(self) -> Variant:
        return VARIANTS[self.feed_forward]

    @property
    def params(self) -> int:
        """The parameters of its layers (one product per token each, embeddings left out)."""
        layers, dim, heads = self.arch
        ffn_matrices = 3 if self.variant.gated else 2
        return layers * (4 * dim * heads * self.head_dim + ffn_matrices * dim * self.ffn)


# The published encoders, by their repositories' names (docs/models.md, benchmarks).
SHAPES = {
    "prot_t5_xl_uniref50": Shape(Arch(24, 1024, 32), 128, 16384, "relu", 32, 128, 1e-6, 128),
    "ankh_base": Shape(Arch(48, 768, 12), 64, 3072, "gated-gelu", 64, 128, 1e-6, 144),
    "ankh_large": Shape(Arch(48, 1536, 16), 64, 3840, "gated-gelu", 64, 128, 1e-6, 144),
}

# transformers' names (T5EncoderModel, T5ForConditionalGeneration) -> esmshard's, part of it.
RENAMES = [
    (r"(shared|encoder\.embed_tokens)\.", "embed.", 0),
    (r"encoder\.block\.(\d+)\.layer\.0\.layer_norm\.", r"layers.\1.attn_norm.", 0),
    (r"encoder\.block\.(\d+)\.layer\.0\.SelfAttention\.q\.", r"layers.\1.qkv.", 0),
    (r"encoder\.block\.(\d+)\.layer\.0\.SelfAttention\.k\.", r"layers.\1.qkv.", 1),
    (r"encoder\.block\.(\d+)\.layer\.0\.SelfAttention\.v\.", r"layers.\1.qkv.", 2),
    (r"encoder\.block\.(\d+)\.layer\.0\.SelfAttention\.o\.", r"layers.\1.out.", 0),
    (
        r"encoder\.block\.0\.layer\.0\.SelfAttention\.relative_attention_bias\.",
        "position_bias.",
        0,
    ),
    (r"encoder\.block\.(\d+)\.layer\.1\.layer_norm\.", r"layers.\1.ffn_norm.", 0),
    (r"encoder\.block\.(\d+)\.layer\.1\.DenseReluDense\.(wi|wi_0)\.", r"layers.\1.wi.", 0),
    (r"encoder\.block\.(\d+)\.layer\.1\.DenseReluDense\.wi_1\.", r"layers.\1.wi.", 1),
    (r"encoder\.block\.(\d+)\.layer\.1\.DenseReluDense\.wo\.", r"layers.\1.wo.", 0),
    (r"encoder\.final_layer_norm\.", "norm.", 0),
]
IGNORED = re.compile(r"(decoder\.|lm_head\.)")  # a full T5's: never read


def is_hf_config(config: dict | None) -> bool:
    return bool(config) and config.get("model_type") == "t5"


def shape_of(folder: Path) -> Shape:
    """The Shape of a T5 encoder folder, from its config.json; ModelError for a variant that
    esmshard does not run (naming the key)."""
    path = Path(folder) / "config.json"
    config = read_config(folder) or {}
    feed_forward = config.get("feed_forward_proj", "relu")
    if feed_forward not in VARIANTS:
        known = ", ".join(f"{v.title} ({k})" for k, v in VARIANTS.items())
        raise ModelError(
            f"{path}: feed_forward_proj {feed_forward!r} is a T5 variant esmshard does not run; "
            f"it runs {known}"
        )
    activation = config.get("dense_act_fn", VARIANTS[feed_forward].activation)
    if activation != VARIANTS[feed_forward].activation:
        raise ModelError(
            f"{path}: dense_act_fn {activation!r} with feed_forward_proj {feed_forward!r} is a T5 "
            f"variant esmshard does not run (its {VARIANTS[feed_forward].title} uses "
            f"{VARIANTS[feed_forward].activation!r})"
        )
    try:
        return Shape(
            Arch(config["num_layers"], config["d_model"], config["num_heads"]),
            config["d_kv"],
            config["d_ff"],
            feed_forward,
            config.get("relative_attention_num_buckets", 32),
            config.get("relative_attention_max_distance", 128),
            float(config.get("layer_norm_epsilon", 1e-6)),
            config["vocab_size"],
        )
    except KeyError as err:
        raise ModelError(f"{path}: no {err.args[0]}; is this a T5 model's config?") from None


def tokenizer_file(folder: Path) -> Path:
    """The tokenizer file the folder ships; ModelError naming the folder where it has none."""
    for name in TOKENIZER_FILES:
        if (Path(folder) / name).is_file():
            return Path(folder) / name
    raise ModelError(
        f"model folder '{folder}' holds no tokenizer ({' or '.join(TOKENIZER_FILES)}): a T5 "
        "encoder's residues are numbered by the tokenizer published with it, and ProtT5 and "
        "Ankh number them differently. Copy the tokenizer files from the model's repository "
        "into the folder (transformers' tokenizer.save_pretrained writes them)"
    )


def read_weights(folder: Path, shape: Shape) -> dict:
    """The encoder's weights as esmshard's T5Encoder names them, fp32, the decoder never read:
    the files' tensors are memory-mapped, and only the encoder's are used."""
    import torch

    parts = {}  # esmshard's name -> {part: tensor}
    for path in folder_weight_files(folder):
        for name, tensor in mapped_tensors(path).items():
            try:
                target = renamed(name, RENAMES, IGNORED)
            except KeyError:
                raise ModelError(
                    f"{path}: tensor {name} has no place in a T5 encoder; is this a T5 model?"
                ) from None
            if target is not None:
                parts.setdefault(target[0], {})[target[1]] = tensor.float()
    return {
        name: torch.cat([p[k] for k in sorted(p)]) if len(p) > 1 else p[0]
        for name, p in parts.items()
    }
