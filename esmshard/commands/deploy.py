"""`esmshard deploy CLONE FOLDER [--tag vX.Y.Z]`: the workflow catalog's deployment of a local
clone (what `snakedeploy deploy-workflow` writes for a hosted repository).

snakedeploy's local provider writes a module path relative to the clone ("workflow/Snakefile"),
which Snakemake resolves beside the deployment and does not find. This writes the same layout
with a path that resolves: the tag's files through Snakemake's git+file source (its local
stand-in for `github(..., tag=...)`), or, without a tag, the clone's own working tree. The
deployment's `config/` and `profiles/` are the tag's (or the tree's), for the user to edit;
a file of the user's already there is never overwritten: esmshard's goes beside it.
"""

import io
import itertools
import os
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path
from typing import NamedTuple

# What the deployment copies for its user to edit (snakedeploy copies the same folders).
EDITABLE = ("config", "profiles")
# In the name of esmshard's file written beside a user's own, which is kept.
NEW = "esmshard-new"

SNAKEFILE = """\
# Deployed by `esmshard deploy` from {source}: the workflow's rules are read from there.
configfile: "config/config.yaml"


module esmshard:
    snakefile:
        "{snakefile}"
    config:
        config


use rule * from esmshard
"""


class DeployError(Exception):
    """Why a deployment cannot be made, in one line."""


def git(clone: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(clone), *args], capture_output=True)


class Deployed(NamedTuple):
    snakefile: Path
    kept: list[tuple[Path, Path]]  # (the user's file, left as it was; esmshard's, beside it)


def deploy(clone: Path, folder: Path, tag: str | None = None) -> Deployed:
    """Write the deployment of `clone` (at `tag`) into `folder`. A file of config/ or profiles/
    that is there already, and differs, is the user's: it is kept, and esmshard's is written
    beside it (`beside`)."""
    clone = clone.resolve()
    if not (clone / "workflow" / "Snakefile").is_file():
        raise DeployError(f"{clone} is not a clone of esmshard (no workflow/Snakefile)")
    problem = not_a_folder(folder)
    if problem:
        raise DeployError(problem)
    snakefile = folder / "workflow" / "Snakefile"
    if snakefile.exists():
        raise DeployError(f"{folder} holds a deployment already; choose another folder")
    if tag is None:
        source, module = str(clone), f"{clone}/workflow/Snakefile"
    elif git(clone, "rev-parse", "--verify", "--quiet", f"refs/tags/{tag}").returncode:
        raise DeployError(
            f"{clone} has no tag {tag} (`make release` in the clone makes the version's tag)"
        )
    else:
        source, module = f"{clone} at {tag}", f"git+file://{clone}/workflow/Snakefile@{tag}"
    kept = []
    try:
        with tempfile.TemporaryDirectory() as scratch:
            for name in EDITABLE:
                files(clone, tag, name, Path(scratch))
            folder.mkdir(parents=True, exist_ok=True)
            for new in sorted(p for p in Path(scratch).rglob("*") if p.is_file()):
                target = folder / new.relative_to(scratch)
                if target.is_file() and target.read_bytes() == new.read_bytes():
                    continue
                if os.path.lexists(target):
                    kept.append((target, beside(target)))
                    target = kept[-1][1]
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(new, target)
        snakefile.parent.mkdir(exist_ok=True)
        snakefile.write_text(SNAKEFILE.format(source=source, snakefile=module))
    except OSError as err:
        raise DeployError(
            f"cannot write the deployment into {folder}: {err.strerror or err} "
            f"({err.filename or folder}); choose a folder you can write"
        ) from None
    return Deployed(snakefile, kept)


def files(clone: Path, tag: str | None, name: str, into: Path) -> None:
    """The clone's folder `name` (at `tag`) written into `into`."""
    if tag is None:
        shutil.copytree(clone / name, into / name)
        return
    archive = git(clone, "archive", "--format=tar", tag, name)
    if archive.returncode:
        raise DeployError(f"{clone} at {tag}: {archive.stderr.decode().strip()}")
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(into, filter="data")


def beside(path: Path) -> Path:
    """A free name beside the user's `path` for esmshard's file of that name:
    config.yaml -> config.esmshard-new.yaml (then config.esmshard-new-2.yaml, ...)."""
    for n in itertools.count(1):
        mark = NEW if n == 1 else f"{NEW}-{n}"
        candidate = path.with_name(f"{path.stem}.{mark}{path.suffix}")
        if not os.path.lexists(candidate):
            return candidate


def not_a_folder(folder: Path) -> str | None:
    """Why `folder` cannot hold a deployment, where its path says so before anything is written."""
    for path in (folder, *folder.parents):
        if path.exists():
            if not path.is_dir():
                what = "is a file" if path == folder else f"is inside {path}, a file"
                return f"{folder} {what}; give a folder for the deployment"
            return None
    return None
