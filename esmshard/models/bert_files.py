"""BERT folders (ProtBert, ProtBert-BFD), as transformers saves them and their authors publish
them: config.json of model_type "bert", the weights (.safetensors files, or the
pytorch_model.bin that Rostlab's repositories hold), and the WordPiece vocabulary `vocab.txt`,
one token per line, a token's number its line's.

ProtBert's authors prepare a sequence as words: its residues space-separated, U, Z, O and B as
X; the tokenizer puts `[CLS]` before them and `[SEP]` after. Each residue is one token of the
vocabulary, so esmshard numbers them from `vocab.txt` itself; a vocabulary with tokens beyond
BERT's specials and residue letters is refused, naming them (its model may expect input
written another way). Only the encoder is read: the pooler and the language-model head are left
out. Nothing here imports torch but `read_weights`, for the workflow's plan.
"""

import re
from pathlib import Path
from typing import NamedTuple

from ..input.fasta import ALPHABET
from .spec import Alphabet, Arch, ModelError, unaccounted_tokens
from .weights import folder_weight_files, mapped_tensors, read_config, renamed

VOCABULARY = "vocab.txt"
SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
RARE_AS_X = "UZOB"  # read as X, as ProtBert's authors prepare sequences
# What esmshard's module computes: BERT's own layers, absolute positions, exact GELU.
BERT_CONFIG = {"hidden_act": "gelu", "position_embedding_type": "absolute"}


class Shape(NamedTuple):
    """All that a BERT encoder's shape is."""

    arch: Arch
    ffn: int  # intermediate_size
    positions: int  # max_position_embeddings: [CLS] and [SEP] among them
    token_types: int  # type_vocab_size
    eps: float  # layer_norm_eps
    vocab: int

    @property
    def params(self) -> int:
        """The parameters of its layers (one product per token each, embeddings left out)."""
        layers, dim, _ = self.arch
        return layers * (4 * dim * dim + 2 * dim * self.ffn)


# The published models, by their repositories' names (docs/models.md, benchmarks): ProtBert and
# ProtBert-BFD share one shape.
SHAPES = {
    "prot_bert": Shape(Arch(30, 1024, 16), 4096, 40000, 2, 1e-12, 30),
    "prot_bert_bfd": Shape(Arch(30, 1024, 16), 4096, 40000, 2, 1e-12, 30),
}

# transformers' names (BertModel; BertForMaskedLM's carry "bert.") -> esmshard's ProtBert's.
RENAMES = [
    (r"embeddings\.word_embeddings\.", "word."),
    (r"embeddings\.position_embeddings\.", "position."),
    (r"embeddings\.token_type_embeddings\.", "token_type."),
    (r"embeddings\.LayerNorm\.", "embed_norm."),
    (r"encoder\.layer\.(\d+)\.attention\.self\.query\.", r"layers.\1.attn_in.0."),
    (r"encoder\.layer\.(\d+)\.attention\.self\.key\.", r"layers.\1.attn_in.1."),
    (r"encoder\.layer\.(\d+)\.attention\.self\.value\.", r"layers.\1.attn_in.2."),
    (r"encoder\.layer\.(\d+)\.attention\.output\.dense\.", r"layers.\1.attn_out."),
    (r"encoder\.layer\.(\d+)\.attention\.output\.LayerNorm\.", r"layers.\1.attn_norm."),
    (r"encoder\.layer\.(\d+)\.intermediate\.dense\.", r"layers.\1.ffn_in."),
    (r"encoder\.layer\.(\d+)\.output\.dense\.", r"layers.\1.ffn_out."),
    (r"encoder\.layer\.(\d+)\.output\.LayerNorm\.", r"layers.\1.ffn_norm."),
]
# The pooler, the language-model head and the position ids (a buffer) are not the encoder's.
IGNORED = re.compile(r"(pooler\.|cls\.|embeddings\.position_ids$|embeddings\.token_type_ids$)")
# Checkpoints converted from TensorFlow name a LayerNorm's weight and bias gamma and beta.
TF_NAMES = {"gamma": "weight", "beta": "bias"}


def is_hf_config(config: dict | None) -> bool:
    return bool(config) and config.get("model_type") == "bert"


def shape_of(folder: Path) -> Shape:
    """The Shape of a BERT folder, from its config.json; ModelError naming the key of a variant
    that esmshard does not compute."""
    path = Path(folder) / "config.json"
    config = read_config(folder) or {}
    for key, wanted in BERT_CONFIG.items():
        if config.get(key, wanted) != wanted:
            raise ModelError(
                f"{path}: {key} is {config.get(key)!r}; esmshard computes BERT with {wanted!r}"
            )
    try:
        return Shape(
            Arch(
                config["num_hidden_layers"], config["hidden_size"], config["num_attention_heads"]
            ),
            config["intermediate_size"],
            config["max_position_embeddings"],
            config.get("type_vocab_size", 2),
            float(config.get("layer_norm_eps", 1e-12)),
            config["vocab_size"],
        )
    except KeyError as err:
        raise ModelError(f"{path}: no {err.args[0]}; is this a BERT model's config?") from None


def vocabulary_file(folder: Path) -> Path:
    path = Path(folder) / VOCABULARY
    if not path.is_file():
        raise ModelError(
            f"model folder '{folder}' holds no {VOCABULARY}: a BERT's residues are numbered by "
            "the vocabulary published with it. Copy vocab.txt from the model's repository into "
            "the folder (transformers' tokenizer.save_pretrained writes it)"
        )
    return path


def alphabet(folder: Path) -> Alphabet:
    """The Alphabet of the BERT in `folder`, from its vocab.txt: each residue letter esmshard's
    input can hold is the token of that letter (U, Z, O and B that of X), `[CLS]` first, `[SEP]`
    last; ModelError naming the file where a token is missing or one is of no known kind."""
    path = vocabulary_file(folder)
    tokens = path.read_text(encoding="utf-8").splitlines()
    index = {token: number for number, token in enumerate(tokens)}
    unknown = [t for t in tokens if t not in SPECIALS and not (len(t) == 1 and t.isupper())]
    if unknown:
        raise unaccounted_tokens(
            path, unknown, "ProtBert's hold BERT's special tokens and one per residue letter"
        )
    words = {letter: "X" if letter in RARE_AS_X else letter for letter in ALPHABET}
    missing = sorted({t for t in (*words.values(), *SPECIALS) if t not in index} - {"[UNK]"})
    if missing:
        raise ModelError(
            f"{path}: the vocabulary has no {', '.join(missing)}; is this ProtBert's?"
        )
    return Alphabet(
        {letter: index[word] for letter, word in words.items()},
        padding_idx=index["[PAD]"],
        cls_idx=index["[CLS]"],
        eos_idx=index["[SEP]"],
        mask_idx=index["[MASK]"],
    )


def read_weights(folder: Path) -> dict:
    """The encoder's weights as esmshard's ProtBert names them, memory-mapped from the files, in
    their dtype."""
    state = {}
    for path in folder_weight_files(folder):
        for name, tensor in mapped_tensors(path).items():
            base = name.removeprefix("bert.")
            try:
                target = renamed(base, RENAMES, IGNORED)
            except KeyError:
                raise ModelError(
                    f"{path}: tensor {name} has no place in a BERT encoder; is this a BERT model?"
                ) from None
            if target is not None:
                stem, _, last = target[0].rpartition(".")
                state[f"{stem}.{TF_NAMES.get(last, last)}"] = tensor
    return state
