"""An offline install for GPU nodes without network: a folder of wheels holding esmshard and every
package it needs that a machine with Python and a (CUDA) torch already installed lacks.

    python -m esmshard.commands.wheelhouse --python 3.12 --out wheelhouse [--have installed.txt]

Run it from a clone, where there is network; on the GPU node, in the environment that has torch:

    pip install --no-index --find-links wheelhouse 'esmshard[cluster]'

('esmshard[cluster,gpu-check]' for `make gpu-check` too: pytest and transformers.)

torch and what torch itself needs are left out (the node's own CUDA build stays); so is every
package named in `--have` (one name per line, as `pip freeze` or `pip list --format=freeze`
writes them: what the node already has). Packages published only as source are built into
wheels here (all of them pure Python).
"""

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[2]
# The Linux x86-64 wheels that run on current GPU nodes (glibc 2.17 and newer).
PLATFORMS = (
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
)
# The SLURM executor (GPU nodes are mostly cluster nodes), and what `make gpu-check` imports.
EXTRAS = "cluster,gpu-check"


def pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", *args], check=True)


def resolve(wheel: Path, extras: str, report: Path) -> list[dict]:
    """What installing `wheel[extras]` would install, as pip's installation report lists it."""
    target = f"{wheel}[{extras}]" if extras else str(wheel)
    pip("install", "--quiet", "--dry-run", "--ignore-installed", "--report", str(report), target)
    return json.loads(report.read_text())["install"]


def closure(root: str, items: dict[str, dict]) -> set[str]:
    """`root` and every resolved package it needs, directly or not (extras only where asked)."""
    found, todo = set(), [(root, frozenset())]
    while todo:
        name, extras = todo.pop()
        if (name, extras) in found or name not in items:
            continue
        found.add((name, extras))
        for spec in items[name]["metadata"].get("requires_dist", []):
            req = Requirement(spec)
            if req.marker is None or any(
                req.marker.evaluate({"extra": extra}) for extra in ("", *extras)
            ):
                todo.append((canonicalize_name(req.name), frozenset(req.extras)))
    return {name for name, _ in found}


def read_have(path: Path | None) -> set[str]:
    """The package names in a `pip freeze`-style file (versions and comments ignored)."""
    if path is None:
        return set()
    names = set()
    for line in path.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            names.add(canonicalize_name(line.split("==")[0].split(" @ ")[0].strip()))
    return names


def build(out: Path, python: str, extras: str = EXTRAS, have: set[str] = frozenset()) -> list[str]:
    """Fill `out` with the wheels; returns the names of the packages it holds."""
    out.mkdir(parents=True, exist_ok=True)
    pip("wheel", "--quiet", "--no-deps", "--wheel-dir", str(out), str(REPO))
    (wheel,) = sorted(out.glob("esmshard-*.whl"))[-1:]
    with tempfile.TemporaryDirectory() as tmp:
        items = {
            canonicalize_name(item["metadata"]["name"]): item
            for item in resolve(wheel, extras, Path(tmp) / "report.json")
        }
    skipped = closure("torch", items) | have | {"esmshard"}
    wanted = {name: item for name, item in items.items() if name not in skipped}
    source_only = [
        f"{name}=={item['metadata']['version']}"
        for name, item in wanted.items()
        if not item["download_info"]["url"].endswith(".whl")
    ]
    binary = [
        f"{name}=={item['metadata']['version']}"
        for name, item in wanted.items()
        if item["download_info"]["url"].endswith(".whl")
    ]
    platforms = [arg for platform in PLATFORMS for arg in ("--platform", platform)]
    if binary:
        pip(
            "download",
            "--quiet",
            "--no-deps",
            "--only-binary=:all:",
            "--python-version",
            python,
            "--implementation",
            "cp",
            *platforms,
            "--dest",
            str(out),
            *binary,
        )
    if source_only:
        pip("wheel", "--quiet", "--no-deps", "--wheel-dir", str(out), *source_only)
    return sorted(wanted)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--python",
        default=f"{sys.version_info.major}.{sys.version_info.minor}",
        help="the GPU node's Python version, e.g. 3.12 (default: this one's)",
    )
    parser.add_argument("--out", type=Path, default=Path("wheelhouse"))
    parser.add_argument(
        "--have", type=Path, help="packages the node already has (pip freeze's output)"
    )
    parser.add_argument(
        "--extras", default=EXTRAS, help=f"esmshard's extras to include (default: {EXTRAS})"
    )
    args = parser.parse_args(argv)
    names = build(args.out, args.python, args.extras, read_have(args.have))
    print(
        f"{args.out}: esmshard and {len(names)} packages for Python {args.python} "
        f"(torch and its own needs left out). On the node, in the environment that has torch: "
        f"pip install --no-index --find-links {args.out} 'esmshard[{args.extras}]'"
    )


if __name__ == "__main__":
    main()
