"""Every family of the one table (esmshard.models.FAMILIES) through the Embedder in bf16 against
its own fp32 forward pass, and each family with FP8 products in fp8: on the CPU (its autocast),
and on a CUDA GPU (a Hopper GPU for fp8), where the weights are placed in autocast's dtype and
ESM C's and ProtBert's products fused (`make gpu-check` runs the GPU cases; they skip without
one)."""

import copy

import numpy as np
import pytest
import torch
from helpers import PROTEINS, read_records

from esmshard.compute.embedder import Embedder
from esmshard.compute.precision import FP8_CAPABILITY, PRECISIONS
from esmshard.models import FAMILIES, bert_files, t5_files
from esmshard.models.layers import FP8
from esmshard.models.spec import Arch
from esmshard.models.t5_tokenizer import alphabet as t5_alphabet
from esmshard.models.t5_tokenizer import write_tokenizer

ARCH = Arch(2, 64, 4)  # small: the arithmetic is the family's, the width does not matter
SEQUENCES = [s[:300] for _, s in read_records(PROTEINS)[:6]]


def small_model(family: str, folder):
    """(a small random model of `family`, its alphabet); T5's and BERT's alphabets from a
    tokenizer file written in `folder`, as their folders hold them."""
    from esmshard.input.fasta import ALPHABET

    torch.manual_seed(0)
    if family == "esm2":
        from esmshard.models.esm2 import random_model

        model = random_model("esm2_t6_8M_UR50D")
        return model, model.alphabet
    if family == "esm1":
        from esmshard.models.esm1 import build

        model = build(ARCH)
        return model, model.alphabet
    if family == "esmc":
        from esmshard.models.esmc import ALPHABET as ESMC_ALPHABET
        from esmshard.models.esmc import ESMC, Shape, ffn_size

        return ESMC(Shape(ARCH, ffn_size(ARCH.dim)), split=True), ESMC_ALPHABET
    if family == "t5":
        from esmshard.models.t5 import T5Encoder

        write_tokenizer(folder, "".join(sorted(ALPHABET)))
        shape = t5_files.Shape(ARCH, 16, 128, "relu", 32, 128, 1e-6, 32)
        residues = t5_alphabet(folder, shape.variant)
        return T5Encoder(shape, residues.padding_idx), residues
    from esmshard.models.bert import ProtBert

    tokens = [*bert_files.SPECIALS, *sorted(ALPHABET)]
    (folder / "vocab.txt").write_text("".join(f"{t}\n" for t in tokens))
    residues = bert_files.alphabet(folder)
    shape = bert_files.Shape(ARCH, 128, 512, 2, 1e-12, len(tokens))
    return ProtBert(shape, residues.padding_idx), residues


def cpu_and_cuda(fp8: bool) -> list:
    """The CPU, and a CUDA GPU where there is one (a Hopper GPU for `fp8`)."""
    if fp8:
        missing = (
            not torch.cuda.is_available() or torch.cuda.get_device_capability() < FP8_CAPABILITY
        )
        why = "needs a GPU that computes FP8 products (Hopper)"
    else:
        missing, why = not torch.cuda.is_available(), "needs a CUDA GPU"
    gpu = [pytest.mark.gpu, pytest.mark.skipif(missing, reason=why)]
    return [pytest.param("cpu", id="cpu"), pytest.param("cuda", id="cuda", marks=gpu)]


def against_fp32(tmp_path, family: str, device: str, precision: str):
    """A small model of `family` through the Embedder in `precision` on `device`, and each
    sequence's per-residue error relative to the same model's fp32 forward pass on the CPU: (the
    Embedder, the errors)."""
    model, alphabet = small_model(family, tmp_path)
    model.eval()
    layer = ARCH.layers if family != "esm2" else 6
    fp32 = Embedder(copy.deepcopy(model), alphabet, [layer], torch.device("cpu"),
                    PRECISIONS["fp32"], kinds=("per_tok",))  # fmt: skip
    tested = Embedder(model, alphabet, [layer], torch.device(device), PRECISIONS[precision],
                      kinds=("per_tok",))  # fmt: skip
    errors = []
    for want, got in zip(fp32.forward(SEQUENCES), tested.forward(SEQUENCES)):
        expected, computed = want[layer].per_tok, got[layer].per_tok
        errors.append(np.abs(computed - expected).mean() / np.abs(expected).mean())
    return tested, errors


@pytest.mark.parametrize("device", cpu_and_cuda(fp8=False))
@pytest.mark.parametrize("family", list(FAMILIES))
def test_every_family_in_bf16_is_its_fp32_forward_pass_within_bf16s_error(
    tmp_path, family, device
):
    bf16, errors = against_fp32(tmp_path, family, device, "bf16")
    if device == "cuda" and bf16.fast:  # the dense layers' weights are autocast's dtype there
        dense = [m for m in bf16.net.modules() if isinstance(m, torch.nn.Linear)]
        assert {m.weight.dtype for m in dense} == {torch.bfloat16}
    for row, error in enumerate(errors):
        # bf16 keeps 8 bits of mantissa: an error of about 1e-2 of the values
        assert 0 < error < 0.03, (family, row, error)  # computed in bf16, and near fp32


@pytest.mark.parametrize("device", cpu_and_cuda(fp8=True))
@pytest.mark.parametrize("family", [name for name, f in FAMILIES.items() if f.fp8])
def test_every_family_with_fp8_products_is_its_fp32_forward_pass_within_fp8s_error(
    tmp_path, family, device
):
    """precision: fp8, each family that offers it: every dense product of its layers in FP8
    (on a GPU after ESM C's products are fused), the rest in bf16, near its fp32 forward pass."""
    fp8, errors = against_fp32(tmp_path, family, device, "fp8")
    products = fp8.net.dense_products()
    assert products and all(linear.weight.dtype == FP8 for linear in products)
    for row, error in enumerate(errors):
        # FP8 (e4m3) keeps 3 bits of mantissa: measured 2-5% of the values on the CPU
        assert 0 < error < 0.08, (family, row, error)
