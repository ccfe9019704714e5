"""Finding and loading ESM-2 models: hub names, local fair-esm checkpoints, models saved by
HuggingFace `transformers` (from its cache or a folder; esmshard.transformers_weights converts
them), random weights.

torch and fair-esm are imported by the functions that need them, so that the Snakefile and the
jobs that run no model (shard, merge, report) read model names without a second spent importing
torch.
"""

import argparse
import pickle
import re
from dataclasses import dataclass
from pathlib import Path

from .checksums import file_checksums

# (layers, embedding dim, attention heads) of the published ESM-2 models.
ESM2_ARCHS = {
    "esm2_t6_8M_UR50D": (6, 320, 20),
    "esm2_t12_35M_UR50D": (12, 480, 20),
    "esm2_t30_150M_UR50D": (30, 640, 20),
    "esm2_t33_650M_UR50D": (33, 1280, 20),
    "esm2_t36_3B_UR50D": (36, 2560, 40),
    "esm2_t48_15B_UR50D": (48, 5120, 40),
}
RANDOM_PREFIX = "random:"
HF_PREFIX = "hf:"
HF_REPO = re.compile(r"[\w.-]+/[\w.-]+")
HF_PATTERNS = ["config.json", "*.safetensors"]  # what is downloaded of a hub repository
RANDOM_SEED = 0
MODEL_URL = "https://dl.fbaipublicfiles.com/fair-esm/models/{}.pt"
REGRESSION_URL = "https://dl.fbaipublicfiles.com/fair-esm/regression/{}-contact-regression.pt"


class ModelError(RuntimeError):
    """A model that cannot be found or safely loaded; the message says what to do."""


@dataclass(frozen=True)
class ModelSpec:
    """What the `model` config value names."""

    name: str  # architecture name, e.g. esm2_t33_650M_UR50D
    kind: str  # "hub", "local", "random", "hf" (a HuggingFace hub id) or "transformers" (a folder)
    path: Path | None = None  # a checkpoint, a folder saved by transformers
    arch: tuple[int, int, int] | None = None  # (layers, embedding dim, heads), where known
    repo: str | None = None  # the HuggingFace hub id

    @property
    def weights(self) -> str:
        return "random" if self.kind == "random" else "pretrained"

    def identity(self, checksum_cache) -> str:
        """Which weights exactly: a local file by the sha256 of its content (computed once per
        file version, esmshard.checksums), so that a copy elsewhere is the same weights."""
        if self.kind == "random":
            return f"random weights, seed {RANDOM_SEED}"
        if self.kind == "hub":
            return f"{self.name} from fair-esm's hub"
        if self.kind == "hf":
            return f"{self.repo} from the HuggingFace hub"
        if self.kind == "transformers":
            from .transformers_weights import weight_files

            files = [self.path / "config.json", *weight_files(self.path)]
            digests = file_checksums(files, checksum_cache)
            return "transformers folder, sha256 " + " ".join(
                f"{f.name}={d}" for f, d in zip(files, digests)
            )
        if not self.path.is_file():
            return f"{self.path.resolve()} (missing)"
        (digest,) = file_checksums([self.path], checksum_cache)
        return f"{self.name} checkpoint, sha256 {digest}"

    @property
    def num_layers(self) -> int | None:
        return self.arch[0] if self.arch else None

    @property
    def embed_dim(self) -> int | None:
        return self.arch[1] if self.arch else None


def parse_spec(model: str) -> ModelSpec:
    if model.startswith(RANDOM_PREFIX):
        name = model[len(RANDOM_PREFIX) :]
        if name not in ESM2_ARCHS:
            raise ModelError(
                f"model '{model}': unknown ESM-2 architecture; use one of {sorted(ESM2_ARCHS)}"
            )
        return ModelSpec(name, "random", arch=ESM2_ARCHS[name])
    if model.startswith(HF_PREFIX):
        repo = model[len(HF_PREFIX) :]
        if not HF_REPO.fullmatch(repo):
            raise ModelError(
                f"model '{model}': a HuggingFace model is hf:<owner>/<name>, e.g. "
                "hf:facebook/esm2_t33_650M_UR50D"
            )
        from .transformers_weights import arch_of

        name = repo.split("/")[1]
        cached = hf_snapshot(repo)
        arch = arch_of(cached) if cached else ESM2_ARCHS.get(name)
        return ModelSpec(name, "hf", cached, arch, repo)
    if Path(model).is_dir():
        from .transformers_weights import arch_of

        path = Path(model)
        return ModelSpec(path.resolve().name, "transformers", path, arch_of(path))
    if model.endswith(".pt"):
        path = Path(model)
        if not path.stem.startswith("esm2"):
            raise ModelError(
                f"model '{model}': a local checkpoint's file name must start with 'esm2' "
                "(fair-esm reads the architecture family from it)"
            )
        return ModelSpec(path.stem, "local", path, ESM2_ARCHS.get(path.stem))
    if model not in ESM2_ARCHS:
        raise ModelError(
            f"model '{model}': not an ESM-2 model name; use one of {sorted(ESM2_ARCHS)}, "
            "hf:<owner>/<name> (HuggingFace), a folder saved by transformers, a local .pt "
            "checkpoint, or random:<name>"
        )
    return ModelSpec(model, "hub", arch=ESM2_ARCHS[model])


def hf_snapshot(repo: str, download: bool = False) -> Path | None:
    """The HuggingFace cache's folder of `repo` (config.json and safetensors weights), None if
    it is not cached; with `download`, fetched into the cache first (ModelError if it cannot be)."""
    from huggingface_hub import constants, snapshot_download

    try:
        return Path(snapshot_download(repo, allow_patterns=HF_PATTERNS, local_files_only=True))
    except Exception:  # not cached (huggingface_hub's error types vary between versions)
        if not download:
            return None
    try:
        return Path(snapshot_download(repo, allow_patterns=HF_PATTERNS))
    except Exception as err:  # any network failure means the same advice
        raise ModelError(
            f"cannot download hf:{repo} from the HuggingFace hub ({type(err).__name__}: "
            f"{str(err).splitlines()[0] if str(err) else ''}). Without network access, run "
            f"`hf download {repo}` where there is network and copy the HuggingFace cache "
            f"({constants.HF_HUB_CACHE}; HF_HOME moves it) here, or set `model:` to a folder "
            "saved by transformers (config.json and .safetensors files)"
        ) from err


def hub_paths(name: str) -> tuple[Path, Path]:
    """Where torch's hub cache keeps a model and its contact-regression weights."""
    import torch

    checkpoints = Path(torch.hub.get_dir()) / "checkpoints"
    return checkpoints / f"{name}.pt", checkpoints / f"{name}-contact-regression.pt"


def regression_path(model_path: Path) -> Path:
    return model_path.with_name(model_path.stem + "-contact-regression.pt")


def ensure_available(spec: ModelSpec) -> None:
    """Make sure the weights can be loaded, downloading hub models into the cache once."""
    if spec.kind in ("random", "transformers"):
        return
    if spec.kind == "hf":
        hf_snapshot(spec.repo, download=True)
        return
    if spec.kind == "local":
        for path in (spec.path, regression_path(spec.path)):
            if not path.is_file():
                raise ModelError(f"model checkpoint '{path}' does not exist")
        return
    import torch

    targets = zip(
        hub_paths(spec.name), (MODEL_URL.format(spec.name), REGRESSION_URL.format(spec.name))
    )
    for path, url in targets:
        if path.is_file():
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            torch.hub.download_url_to_file(url, str(path), progress=False)
        except Exception as err:  # any network failure means the same advice
            raise ModelError(
                f"cannot download {spec.name} weights from {url} ({err}). Without network access, "
                f"put {spec.name}.pt and {spec.name}-contact-regression.pt into {path.parent} "
                "(the torch hub cache; TORCH_HOME moves it), or set `model:` to the path of a local "
                ".pt checkpoint"
            ) from err


def safe_load(path: Path) -> dict:
    """torch.load that unpickles tensors and fair-esm's argparse.Namespace config, nothing else."""
    import torch

    try:
        with torch.serialization.safe_globals([argparse.Namespace]):
            return torch.load(str(path), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        found = [line for line in str(err).splitlines() if "GLOBAL" in line]
        raise ModelError(
            f"refusing to load '{path}': it holds objects other than tensors and a fair-esm "
            f"config, and unpickling them could run arbitrary code ({' '.join(found) or err})"
        ) from err


def random_model(name: str):
    """The ESM-2 architecture `name` with seeded random weights (tests and benchmarks only)."""
    import torch
    from esm.model.esm2 import ESM2

    layers, dim, heads = ESM2_ARCHS[name]
    with torch.random.fork_rng():
        torch.manual_seed(RANDOM_SEED)
        return ESM2(num_layers=layers, embed_dim=dim, attention_heads=heads, alphabet="ESM-1b")


def load(spec: ModelSpec):
    """Return (model, alphabet) in eval mode on the CPU."""
    from esm.pretrained import load_model_and_alphabet_core

    if spec.kind == "random":
        model = random_model(spec.name)
        alphabet = model.alphabet
    elif spec.kind in ("hf", "transformers"):
        from .transformers_weights import esm2_from_transformers

        # An hf: model not cached when its name was read is fetched now.
        folder = spec.path or hf_snapshot(spec.repo, download=True)
        model = esm2_from_transformers(folder)
        alphabet = model.alphabet
    else:
        path = spec.path if spec.kind == "local" else hub_paths(spec.name)[0]
        ensure_available(spec)
        model_data = safe_load(path)
        regression_data = safe_load(regression_path(path))
        model, alphabet = load_model_and_alphabet_core(spec.name, model_data, regression_data)
    return model.eval(), alphabet


def write_checkpoint(model, directory: Path, name: str) -> Path:
    """Save `model` in fair-esm's on-disk format: `<name>.pt` plus its contact-regression file."""
    import torch

    directory.mkdir(parents=True, exist_ok=True)
    state = model.state_dict()
    regression_keys = [k for k in state if k.startswith("contact_head.regression.")]
    body = {
        f"encoder.sentence_encoder.{k}": v for k, v in state.items() if k not in regression_keys
    }
    cfg = argparse.Namespace(
        encoder_layers=model.num_layers,
        encoder_embed_dim=model.embed_dim,
        encoder_ffn_embed_dim=4 * model.embed_dim,
        encoder_attention_heads=model.attention_heads,
        token_dropout=model.token_dropout,
        arch="esm2",
    )
    path = directory / f"{name}.pt"
    torch.save({"model": body, "cfg": {"model": cfg}}, path)
    torch.save({"model": {k: state[k] for k in regression_keys}}, regression_path(path))
    return path
