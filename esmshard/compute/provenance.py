"""What computed each number: the device, precision and software behind a store part, and a
run's summary of them (`precision: auto` resolves per device, so one store key may hold parts
computed in different precisions)."""

import json
from collections import Counter
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import h5py

from ..models import parse_spec
from ..models.spec import ModelSpec
from ..store.checksums import file_checksums
from ..version import __version__

# A part's attributes that say what computed it; parts written before they existed read "unknown".
COMPUTED_WITH = (
    "device_name",
    "precision",
    "esmshard_version",
    "torch_version",
    "cuda_version",
    "fair_esm_version",
)
UNKNOWN = "unknown"


def software() -> dict[str, str]:
    """The versions an embed job computes with (torch imported: call it from one)."""
    import torch

    try:
        fair_esm = version("fair-esm")
    except PackageNotFoundError:
        fair_esm = UNKNOWN
    return {
        "esmshard_version": __version__,
        "torch_version": str(torch.__version__),
        "cuda_version": str(torch.version.cuda or "none"),
        "fair_esm_version": fair_esm,
    }


def computed_with(attrs) -> tuple[str, ...]:
    """A part's COMPUTED_WITH values, from its HDF5 attributes."""
    return tuple(str(attrs.get(name, UNKNOWN)) for name in COMPUTED_WITH)


def summary(parts: Counter) -> list[dict]:
    """One row per distinct COMPUTED_WITH among the parts (a Counter of `computed_with` values),
    with the number of parts."""
    return [
        {**dict(zip(COMPUTED_WITH, values)), "parts": count}
        for values, count in sorted(parts.items())
    ]


def mixed_precisions(rows: list[dict]) -> str:
    """'' when every part was computed in one precision, else what to tell the user."""
    by_precision = Counter()
    for row in rows:
        by_precision[row["precision"]] += row["parts"]
    if len(by_precision) < 2:
        return ""
    counts = ", ".join(
        f"{name} ({n} part{'s' if n > 1 else ''})" for name, n in sorted(by_precision.items())
    )
    return (
        f"mixed precisions: {counts}; `precision: auto` resolved differently on the devices "
        "that computed them (set `precision` to one value for one precision throughout)"
    )


def attributes(rows: list[dict]) -> dict:
    """What embeddings.h5 records of them, beside its `precision` attribute."""
    return {
        "esmshard_version": __version__,
        "computed_with": json.dumps(rows),
        "devices": json.dumps(sorted({row["device_name"] for row in rows})),
    }


# What made a run's numbers, as every output names it (embeddings.h5's attributes, run.json, each
# export's metadata and the report): one table, in this order.
MADE_BY = (
    "model",  # as the config gave it
    "model_family",
    "num_layers",
    "embed_dim",
    "weights",  # "random" or "pretrained"
    "weights_source",  # where they came from: a path, a hub, a repository and revision
    "weights_sha256",  # of the weights file (file=digest for several), or "random"
    "settings_key",  # the store's key of the embedding settings
    "esmshard_version",
    "precision",
)


def weight_files(spec: ModelSpec) -> list[Path]:
    """The files that hold `spec`'s weights (none for random weights)."""
    if spec.kind == "random":
        return []
    if spec.kind == "hub":
        from ..models.esm2_files import hub_paths

        return [path for path in hub_paths(spec.name)[:1] if path.is_file()]
    return list(spec.files) or [spec.path]


def weights_source(spec: ModelSpec) -> str:
    if spec.kind == "random":
        return "random weights of the published shape, seed 0"
    if spec.kind == "hub":
        return f"fair-esm's hub ({spec.name})"
    if spec.kind == "hf":
        return f"HuggingFace {spec.repo} revision {spec.revision}"
    return str(Path(spec.path).resolve())


def weights_sha256(spec: ModelSpec, checksum_cache) -> str:
    """`spec`'s weights by the SHA-256 of their files (file=digest for several), computed once
    per file version; "random", or "unknown" where no file is there yet."""
    if spec.kind == "random":
        return "random"
    files = weight_files(spec)
    digests = file_checksums(files, checksum_cache) if files else []
    if len(files) == 1:
        return digests[0]
    return " ".join(f"{f.name}={d}" for f, d in zip(files, digests)) or "unknown"


def made_by(settings: dict, key: str, precision: str, checksum_cache) -> dict:
    """What made the numbers computed with `settings` (the run's embedding settings), keyed as
    MADE_BY: the weights' SHA-256 computed once per file version (`checksum_cache`)."""
    spec = parse_spec(settings["model"])
    sha256 = weights_sha256(spec, checksum_cache)
    return {
        "model": settings["model"],
        "model_family": settings["family"],
        "num_layers": spec.num_layers,
        "embed_dim": spec.embed_dim,
        "weights": spec.weights,
        "weights_source": weights_source(spec),
        "weights_sha256": sha256,
        "settings_key": key,
        "esmshard_version": __version__,
        "precision": precision,
    }


def made_by_of(embeddings) -> dict | None:
    """What made an existing embeddings.h5 (its `MADE_BY` attributes, as Python values), or
    None where there is no readable file."""
    try:
        with h5py.File(embeddings, "r") as h5:
            found = {name: h5.attrs[name] for name in MADE_BY if name in h5.attrs}
            return {name: getattr(v, "item", lambda v=v: v)() for name, v in found.items()}
    except (OSError, KeyError):
        return None
