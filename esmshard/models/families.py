"""The model families esmshard runs, in one table (FAMILIES), and how a model is loaded.

A new family is one module (its forward pass and loading, see Family), its weight readers, and
one row here.
"""

from . import archs, esm2_files
from .spec import Family, ModelSpec

ESM2 = Family(
    name="esm2",
    title="ESM-2",
    module="esmshard.models.esm2",
    archs=archs.ESM2,
    max_residues=1022,
    contacts=True,
    scores=True,
    fp8=True,
)
ESM1 = Family(
    name="esm1",
    title="ESM-1b/1v",
    module="esmshard.models.esm1",
    archs=archs.ESM1,
    max_residues=1022,  # 1,024 learned positions, BOS and EOS among them
    contacts=True,  # ESM-1b's; ESM-1v's checkpoints have no contact regression (contact_problems)
    scores=True,
    fp8=True,
)
ESMC = Family(
    name="esmc",
    title="ESM C",
    module="esmshard.models.esmc",
    archs=archs.ESMC,
    max_residues=2048,
    contacts=False,
    scores=True,
    fp8=True,
)
T5 = Family(
    name="t5",
    title="T5 encoder",
    module="esmshard.models.t5",
    archs={},  # a T5 needs its tokenizer's files: no random:<name> (t5_files.SHAPES lists them)
    max_residues=4096,  # esmshard's default limit: relative positions have no end
    contacts=False,
    bos=False,
    positions_end=False,
    members="ProtT5, ProstT5, Ankh",
)
BERT = Family(
    name="bert",
    title="BERT encoder",
    module="esmshard.models.bert",
    archs={},  # a BERT needs its vocab.txt: no random:<name> (bert_files.SHAPES lists them)
    max_residues=4096,  # esmshard's default limit: its 40,000 positions end far beyond
    contacts=False,
    positions_end=False,
    members="ProtBert, ProtBert-BFD",
)
FAMILIES = {family.name: family for family in (ESM2, ESM1, ESMC, T5, BERT)}


def families_named() -> str:
    """Every family esmshard runs, as `--help` and the errors list them."""
    return ", ".join(family.named for family in FAMILIES.values())


# The families whose published models fair-esm's hub serves by name (their checkpoints' files).
FAIR_ESM = (ESM2, ESM1)


def ensure_available(spec: ModelSpec) -> None:
    """Fetch what the model needs before the embed jobs start (fair-esm's hub weights)."""
    if spec.family in FAIR_ESM:
        esm2_files.ensure_available(spec)


def load(spec: ModelSpec):
    """(model in eval mode on the CPU, its alphabet); the model, or FastESM2 over it, is a
    forward pass as esmshard.models.spec.Family describes it."""
    return spec.family.runner().load(spec)
