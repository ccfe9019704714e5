"""ESM-1b and ESM-1v (fair-esm's `ProteinBertModel`, architecture `roberta_large`): fair-esm's
own model and loading.

Their arithmetic is ESM-2's but for learned absolute positions (1,024 of them, so 1,022 residues),
a layer norm before the first layer, and token dropout scaling as fair-esm applies it; fair-esm's
loader zeroes the mask token's embedding. Their layers are ESM-2's, so esmshard's fast forward
pass (esmshard.models.esm2.FastESM2: fused attention, packed batches, compile) runs them, its
positions learned instead of rotary; contact maps and `fast_path: false` take fair-esm's own
forward pass. ESM-1v's five checkpoints are the variant-effect
ensemble; none has contact-regression weights, so contact maps come from ESM-1b alone (fair-esm's
contact head over its attention maps; ESM-1v's are refused before any job).
"""

import argparse
from pathlib import Path

import torch

from .archs import ESM1 as ARCHS
from .esm2_files import ensure_available, hub_paths, regression_path
from .spec import RANDOM_SEED, Arch, ModelSpec
from .weights import safe_load

ARCH = "roberta_large"  # fair-esm's name for the ESM-1b layout


def args_of(arch: Arch) -> argparse.Namespace:
    """fair-esm's config of an ESM-1b layout of `arch`, as its checkpoints hold it (the
    `encoder_` names that its loader strips)."""
    layers, dim, heads = arch
    return argparse.Namespace(
        arch=ARCH,
        encoder_layers=layers,
        encoder_embed_dim=dim,
        encoder_ffn_embed_dim=4 * dim,
        encoder_attention_heads=heads,
        max_positions=1024,
        token_dropout=True,
        final_bias=True,
    )


def named(model, alphabet):
    """fair-esm's ProteinBertModel with the names esmshard reads of every model (ESM-2's own):
    its layers, width, heads and alphabet."""
    args = model.args  # its `num_layers` is a property of fair-esm's
    model.embed_dim, model.attention_heads = args.embed_dim, args.attention_heads
    model.alphabet = alphabet
    return model


def build(arch: Arch):
    """An ESM-1b layout of `arch` with random weights (torch's current seed), as fair-esm's
    loader builds it (the layer norm before the first layer included)."""
    import esm

    args = {k.removeprefix("encoder_"): v for k, v in vars(args_of(arch)).items()}
    alphabet = esm.Alphabet.from_architecture(ARCH)
    model = esm.ProteinBertModel(argparse.Namespace(**args, emb_layer_norm_before=True), alphabet)
    return named(model, alphabet)


def random_model(name: str):
    """The ESM-1b/1v architecture `name` with seeded random weights (tests and benchmarks)."""
    with torch.random.fork_rng():
        torch.manual_seed(RANDOM_SEED)
        return build(ARCHS[name])


def load(spec: ModelSpec):
    """(fair-esm's ProteinBertModel in eval mode on the CPU, its alphabet), loaded by fair-esm's
    own loader from the checkpoint and, where one lies beside it, its contact-regression file."""
    if spec.kind == "random":
        model = random_model(spec.name)
        return model.eval(), model.alphabet
    from esm.pretrained import load_model_and_alphabet_core

    ensure_available(spec)
    path = spec.path if spec.kind == "local" else hub_paths(spec.name)[0]
    regression = regression_path(path)
    # fair-esm's loader picks its reader by the name it is given (ESM-2's for "esm2..."):
    # the layout's own name, whatever the file is called.
    model, alphabet = load_model_and_alphabet_core(
        ARCH,
        safe_load(path),
        safe_load(regression) if regression.is_file() else None,
    )
    return named(model, alphabet).eval(), alphabet


def write_checkpoint(model, directory: Path, name: str) -> Path:
    """Save `model` (random_model's) in fair-esm's on-disk format of the published files:
    `<name>.pt` ({"args", "model"}: the layers under `encoder.sentence_encoder.`, the language
    model head under `encoder.`), and for ESM-1b its contact-regression file beside it."""
    directory.mkdir(parents=True, exist_ok=True)
    state = model.state_dict()
    regression = {k: v for k, v in state.items() if k.startswith("contact_head.regression.")}
    body = {
        (f"encoder.{k}" if k.startswith("lm_head.") else f"encoder.sentence_encoder.{k}"): v
        for k, v in state.items()
        if k not in regression
    }
    path = directory / f"{name}.pt"
    arch = Arch(model.num_layers, model.embed_dim, model.attention_heads)
    torch.save({"args": args_of(arch), "model": body}, path)
    if not name.startswith("esm1v"):
        torch.save({"model": regression}, regression_path(path))
    return path
