"""What computed each number: the device, precision and software behind a store part, and a
run's summary of them (`precision: auto` resolves per device, so one store key may hold parts
computed in different precisions)."""

import json
from collections import Counter
from importlib.metadata import PackageNotFoundError, version

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
