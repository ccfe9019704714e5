"""What a `model:` value names (ModelSpec), and what a family of models declares (Family)."""

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from ..store.checksums import file_checksums

RANDOM_SEED = 0


class ModelError(RuntimeError):
    """A model that cannot be found or safely loaded; the message says what to do."""


def unaccounted_tokens(path, tokens: list[str], held: str) -> ModelError:
    """The refusal of a tokenizer file at `path` with `tokens` of no kind its family's models
    hold (`held` says what they are): its model may expect its input written another way."""
    shown = ", ".join(tokens[:8]) + (f" and {len(tokens) - 8} more" if len(tokens) > 8 else "")
    return ModelError(
        f"{path}: the tokenizer has tokens esmshard cannot account for ({shown}); {held}. Its "
        "model may expect its input written another way: esmshard does not embed it under "
        "their conventions"
    )


class Arch(NamedTuple):
    layers: int
    dim: int
    heads: int


class Alphabet(NamedTuple):
    """The token indices the Embedder asks for, as fair-esm's Alphabet names them (its ESM-2
    alphabet is one): a family without a BOS token has `prepend_bos` False and no `cls_idx`."""

    tok_to_idx: dict  # a one-letter token is a residue's
    padding_idx: int
    cls_idx: int | None  # BOS
    eos_idx: int
    mask_idx: int | None
    prepend_bos: bool = True

    def check_fits(self, path, vocab: int) -> "Alphabet":
        """This alphabet, or ModelError naming the tokenizer file `path` where it numbers a token
        that the model, of `vocab` embeddings (its config's vocab_size), has none for."""
        named = {**self.tok_to_idx, "padding": self.padding_idx, "end": self.eos_idx,
                 "start": self.cls_idx, "mask": self.mask_idx}  # fmt: skip
        token, number = max(
            ((t, n) for t, n in named.items() if n is not None), key=lambda x: x[1]
        )
        if number >= vocab:
            raise ModelError(
                f"{path}: the tokenizer numbers the {token} token {number}, beyond the model's "
                f"{vocab} token embeddings (config.json's vocab_size): it is another model's "
                "tokenizer; use the one saved with these weights"
            )
        return self


def shape_named(title: str, arch: Arch) -> str:
    """A model's shape as the errors name it: 'ESM-2 of 6 layers and dimension 320'."""
    return f"{title} of {arch.layers} layers and dimension {arch.dim}"


def take_weights(model, state: dict, path, title: str, arch: Arch) -> None:
    """`model` (built without storage) takes the tensors of `state` as its own; ModelError naming
    the weights `path` and the tensors missing, or of no place in the model of `title` and
    `arch` that its config says (torch's RuntimeError for a tensor of another shape:
    esmshard.models.fit_problems)."""
    missing, unexpected = model.load_state_dict(state, strict=False, assign=True)

    def named(names) -> str:
        listed = ", ".join(names[:3]) + (" …" if len(names) > 3 else "")
        return f"{len(names)} tensor{'s' if len(names) != 1 else ''} ({listed})"

    said = ([f"they lack {named(missing)}"] if missing else []) + (
        [f"they have {named(unexpected)} of no place in it"] if unexpected else []
    )
    if said:
        raise ModelError(
            f"{path}: the weights do not fit the {shape_named(title, arch)} that its config says: "
            f"{'; '.join(said)} (a file cut short, or the config of another model?)"
        )


@dataclass(frozen=True)
class Family:
    """One row of the families table (esmshard.models.FAMILIES): what the pipeline asks of a family.

    `module` loads and runs the family's models (it imports torch, so it is imported only where a
    model runs): `load(spec) -> (model, alphabet)` and `random_model(name)`. Its model, or the
    fast forward pass over it, is called as `net(tokens, repr_layers, padded)` and returns
    {"representations": {layer: B × L × D}}, layer 0 the embeddings and layer `layers` after the
    final norm; tokens are BOS (where the family has one), residues, EOS, padding (`alphabet`
    names their indices).
    """

    name: str  # as settings, store keys and outputs name it
    title: str  # as people write it
    module: str
    archs: dict[str, Arch]  # published shapes by name: random:<name> builds one
    max_residues: int  # the longest sequence it was trained on, BOS and EOS left out
    contacts: bool  # whether it has a contact head (`include: contacts`)
    # whether esmshard runs its language-model head (`include: logits, masked_marginals, pll`)
    scores: bool = False
    bos: bool = True  # whether its sequences start with a BOS token (`include: bos`)
    fp8: bool = False  # whether its layers' dense products run in FP8 (`precision: fp8`)
    # Whether `max_residues` is where its positions end (a longer truncation_seq_length is
    # refused), or only esmshard's default limit (relative positions have no end).
    positions_end: bool = True
    members: str = ""  # the published models it runs, where its title does not name them

    @property
    def named(self) -> str:
        """Its title and its members, as lists of families name it."""
        return f"{self.title} ({self.members})" if self.members else self.title

    def runner(self):
        return importlib.import_module(self.module)


@dataclass(frozen=True)
class ModelSpec:
    """What the `model` config value names, its family read from the weights' own files."""

    family: Family
    name: str  # e.g. esm2_t33_650M_UR50D, or a file's or folder's name
    kind: str  # "hub" (fair-esm's), "local" (a file), "folder", "hf" (a hub id) or "random"
    path: Path | None = None  # the weights file or folder, where there is one
    arch: Arch | None = None  # where known before loading
    repo: str | None = None  # the HuggingFace hub id
    revision: str | None = None  # the commit of the hub repository that was loaded
    files: tuple[Path, ...] = ()  # what `identity` hashes for a folder
    layer_params: int | None = None  # its layers' parameters, where not ESM's 12·layers·D²

    @property
    def weights(self) -> str:
        return "random" if self.kind == "random" else "pretrained"

    def identity(self, checksum_cache) -> str:
        """Which weights exactly: a file by the sha256 of its content (computed once per file
        version, esmshard.store.checksums), so that a copy elsewhere is the same weights; a hub
        download by its repository and revision."""
        if self.kind == "random":
            return f"random weights, seed {RANDOM_SEED}"
        if self.kind == "hub":
            return f"{self.name} from fair-esm's hub"
        if self.kind == "hf":
            return f"{self.repo} revision {self.revision} from the HuggingFace hub"
        if self.kind == "folder":
            digests = file_checksums(self.files, checksum_cache)
            return "folder, sha256 " + " ".join(
                f"{f.relative_to(self.path)}={d}" for f, d in zip(self.files, digests)
            )
        if not self.path.is_file():
            return f"{self.path.resolve()} (missing)"
        (digest,) = file_checksums([self.path], checksum_cache)
        return f"{self.name} checkpoint, sha256 {digest}"

    @property
    def num_layers(self) -> int | None:
        return self.arch.layers if self.arch else None

    @property
    def embed_dim(self) -> int | None:
        return self.arch.dim if self.arch else None

    @property
    def params(self) -> int | None:
        """Its layers' parameters (embeddings and heads left out): what a token costs."""
        if self.layer_params is not None:
            return self.layer_params
        return 12 * self.arch.layers * self.arch.dim**2 if self.arch else None
