"""fair-esm's own files (ESM-2's, and ESM-1b's and ESM-1v's): a checkpoint (`.pt`, with its
`-contact-regression.pt` beside it but for ESM-1v's, which have none) told by its tensors and
config, fair-esm's hub cache, and downloading into it. torch is imported only to download and to
find the cache.
"""

from pathlib import Path

from .spec import Arch, ModelError, ModelSpec

# The prefixes of fair-esm's tensor names that its loader takes away (either, as it does).
PREFIXES = ("encoder.sentence_encoder.", "encoder.")


def is_checkpoint(contents) -> bool:
    """Whether a checkpoint's contents (esmshard.models.weights.checkpoint_contents) are ESM-2's:
    fair-esm's layers with rotary embeddings (ESM-1b's learned positions are refused)."""
    tensors = contents.get("model") if isinstance(contents, dict) else None
    if not isinstance(tensors, dict) or "cfg" not in contents:
        return False
    return any(f"{p}emb_layer_norm_after.weight" in tensors for p in PREFIXES) and not any(
        "embed_positions" in name for name in tensors
    )


# fair-esm's config names of an ESM-1b checkpoint's shape (with or without `encoder_`).
ARGS = ("layers", "embed_dim", "attention_heads")


def is_esm1_checkpoint(contents) -> bool:
    """Whether a checkpoint's contents are ESM-1b's layout (fair-esm's `roberta_large`: ESM-1b,
    ESM-1v)."""
    tensors = contents.get("model") if isinstance(contents, dict) else None
    args = contents.get("args") if isinstance(contents, dict) else None
    return isinstance(tensors, dict) and getattr(args, "arch", None) == "roberta_large"


def esm1_arch_of(path: Path, contents) -> Arch:
    args = vars(contents["args"])
    found = [args.get(f"encoder_{k}", args.get(k)) for k in ARGS]  # fair-esm reads either
    if not all(isinstance(value, int) for value in found):
        raise ModelError(
            f"{path}: an ESM-1b checkpoint without fair-esm's config (encoder_layers, "
            "encoder_embed_dim, encoder_attention_heads)"
        )
    return Arch(*found)


def has_regression(name: str) -> bool:
    """Whether fair-esm's checkpoint `name` comes with contact-regression weights: all but
    ESM-1v's (fair-esm's own rule, by name)."""
    return "esm1v" not in name


def arch_of(path: Path, contents) -> Arch:
    cfg = contents["cfg"].get("model") if isinstance(contents["cfg"], dict) else None
    try:
        return Arch(cfg.encoder_layers, cfg.encoder_embed_dim, cfg.encoder_attention_heads)
    except AttributeError:
        raise ModelError(
            f"{path}: an ESM-2 checkpoint without fair-esm's config (cfg.model.encoder_layers, "
            "encoder_embed_dim, encoder_attention_heads)"
        ) from None


MODEL_URL = "https://dl.fbaipublicfiles.com/fair-esm/models/{}.pt"
REGRESSION_URL = "https://dl.fbaipublicfiles.com/fair-esm/regression/{}-contact-regression.pt"


def hub_paths(name: str) -> tuple[Path, Path]:
    """Where torch's hub cache keeps a model and its contact-regression weights."""
    import torch

    checkpoints = Path(torch.hub.get_dir()) / "checkpoints"
    return checkpoints / f"{name}.pt", checkpoints / f"{name}-contact-regression.pt"


def regression_path(model_path: Path) -> Path:
    return model_path.with_name(model_path.stem + "-contact-regression.pt")


def file_problems(spec: ModelSpec) -> list[str]:
    """Why a local checkpoint cannot be loaded as its files lie: ESM-2's are two files. An
    ESM-1b/1v checkpoint loads alone (ESM-1v's have no second file, and its contents do not
    tell ESM-1b from ESM-1v): its contact maps ask for the second (esmshard.models.
    contact_problems)."""
    if spec.kind != "local":
        return []
    if not spec.path.is_file():
        return [f"model checkpoint '{spec.path}' does not exist"]
    regression = regression_path(spec.path)
    if spec.family.name == "esm2" and not regression.is_file():
        return [
            f"model checkpoint '{spec.path}': its contact-regression weights '{regression}' are "
            "not beside it; fair-esm's checkpoints come as these two files: put both in one folder"
        ]
    return []


def ensure_available(spec: ModelSpec) -> None:
    """Make sure the weights can be loaded, downloading hub models into the cache once."""
    if spec.kind == "local":
        problems = file_problems(spec)
        if problems:
            raise ModelError(problems[0])
        return
    if spec.kind != "hub":
        return
    import torch

    targets = list(
        zip(hub_paths(spec.name), (MODEL_URL.format(spec.name), REGRESSION_URL.format(spec.name)))
    )[: 2 if has_regression(spec.name) else 1]
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
                ".pt checkpoint. To try esmshard offline, use random weights of the same shape: "
                f"model=random:{spec.name}"
            ) from err
