"""`esmshard deploy CLONE FOLDER [--tag vX.Y.Z]`: the workflow catalog's deployment of a local
clone (what `snakedeploy deploy-workflow` writes for a hosted repository).

snakedeploy's local provider writes a module path relative to the clone ("workflow/Snakefile"),
which Snakemake resolves beside the deployment and does not find. This writes the same layout
with a path that resolves: the tag's files through Snakemake's git+file source (its local
stand-in for `github(..., tag=...)`), or, without a tag, the clone's own working tree. The
deployment's `config/` and `profiles/` are the tag's (or the tree's), for the user to edit.
"""

import io
import shutil
import subprocess
import tarfile
from pathlib import Path

# What the deployment copies for its user to edit (snakedeploy copies the same folders).
EDITABLE = ("config", "profiles")

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


def deploy(clone: Path, folder: Path, tag: str | None = None) -> Path:
    """Write the deployment of `clone` (at `tag`) into `folder`; returns its Snakefile."""
    clone = clone.resolve()
    if not (clone / "workflow" / "Snakefile").is_file():
        raise DeployError(f"{clone} is not a clone of esmshard (no workflow/Snakefile)")
    snakefile = folder / "workflow" / "Snakefile"
    if snakefile.exists():
        raise DeployError(f"{folder} holds a deployment already; choose another folder")
    if tag is None:
        source, module = str(clone), f"{clone}/workflow/Snakefile"
    else:
        if git(clone, "rev-parse", "--verify", "--quiet", f"refs/tags/{tag}").returncode:
            raise DeployError(
                f"{clone} has no tag {tag} (`make release` in the clone makes the version's tag)"
            )
        source, module = f"{clone} at {tag}", f"git+file://{clone}/workflow/Snakefile@{tag}"
    folder.mkdir(parents=True, exist_ok=True)
    for name in EDITABLE:
        if tag is None:
            shutil.copytree(clone / name, folder / name, dirs_exist_ok=True)
            continue
        archive = git(clone, "archive", "--format=tar", tag, name)
        if archive.returncode:
            raise DeployError(f"{clone} at {tag}: {archive.stderr.decode().strip()}")
        with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
            tar.extractall(folder, filter="data")
    snakefile.parent.mkdir(exist_ok=True)
    snakefile.write_text(SNAKEFILE.format(source=source, snakefile=module))
    return snakefile
