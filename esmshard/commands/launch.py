"""`esmshard run`: the `snakemake` command that runs esmshard's workflow from any folder.

The workflow's files (Snakefile, rules, scripts, schema, default config, profiles) ship inside
the installed package, under `workflow_files/` (setup.py copies them at build time); in a clone
they are the repository's own. The command is printed before it runs, so that it can be typed
again, changed, or put into a job script: `esmshard run` adds nothing that the workflow does not
do when started by hand.
"""

import json
import os
import shlex
import shutil
import sys
from pathlib import Path
from typing import NamedTuple

import yaml

from ..compute.pool import visible_devices
from ..install import CLONE, SHIPPED
from ..store.runlock import TYPED_COMMAND_ENV

# The settings `esmshard run` has options for; --config KEY=VALUE gives them as well.
OWN_KEYS = ("input", "outdir", "gpus", "model")
# Set for the workflow by `esmshard run`: read the workflow's own config/config.yaml (its
# defaults), not one that the current folder holds for a project of its own.
DEFAULTS_ENV = "ESMSHARD_WORKFLOW_CONFIG"


class LaunchError(ValueError):
    """A `esmshard run` option that cannot work, with what to do."""


class Launch(NamedTuple):
    """What `esmshard run` was asked for."""

    inputs: list[str]
    outdir: str | None
    gpus: str = "auto"  # "auto" or "0,1,2"
    model: str | None = None
    profile: str | None = None
    cores: str = "all"
    config: list[str] = []  # KEY=VALUE, as after snakemake's --config
    snakemake_args: list[str] = []  # passed on as they are
    verbose: bool = False  # Snakemake's own output on the console
    progress_every: float | None = None  # seconds between progress lines without a terminal


def workflow_root() -> Path:
    """The folder holding the workflow's Snakefile: the installed copy, or the clone's own."""
    for root in (SHIPPED, CLONE):
        if (root / "Snakefile").is_file() and (root / "workflow" / "Snakefile").is_file():
            return root
    raise LaunchError(
        f"esmshard's workflow files are missing from {SHIPPED}; reinstall esmshard from its "
        "wheel or sdist (pip install --force-reinstall esmshard)"
    )


def profile_folder(profile: str, root: Path) -> Path:
    """A profile folder the user names by path, or one that esmshard ships (by name)."""
    if Path(profile).is_dir():
        return Path(profile).resolve()
    shipped = root / "profiles" / profile
    if shipped.is_dir() and profile != "default":
        return shipped
    raise LaunchError(
        f"--profile {profile}: no such folder, and esmshard ships none of that name "
        f"(it ships: {', '.join(shipped_profiles(root))}); give one of those names or a profile "
        "folder"
    )


def shipped_profiles(root: Path) -> list[str]:
    """The names of the cluster profiles esmshard ships (not `default`, the workflow's own)."""
    return sorted(p.name for p in (root / "profiles").iterdir() if p.name != "default")


def gpu_list(gpus: str) -> list[int] | str:
    """`--gpus` as the config's `gpus` value: "auto" or a list of device indices."""
    if gpus == "auto":
        return "auto"
    try:
        indices = [int(g) for g in gpus.split(",")]
    except ValueError:
        indices = []
    if not indices or min(indices) < 0 or len(set(indices)) < len(indices):
        raise LaunchError(
            f"--gpus {gpus}: give device indices separated by commas (e.g. 0,1,2,3), or auto"
        )
    return indices


def typed_list(text: str) -> list[str]:
    """A --config list value as typed ('[a,b]', 'a'), read as Snakemake reads it."""
    value = yaml.safe_load(text) if text.strip().startswith("[") else text
    return [str(item) for item in value] if isinstance(value, list) else [str(value)]


def with_config_options(launch: Launch) -> Launch:
    """`launch` with the --config values of keys that have options (input, outdir, gpus, model)
    moved to those options: typed either way, they mean the same."""
    options, rest = {}, []
    for item in launch.config:
        key, _, value = item.partition("=")
        if "=" not in item or not key:
            raise LaunchError(f"--config {item}: give KEY=VALUE, e.g. 'repr_layers=[-1,6]'")
        if key not in OWN_KEYS:
            rest.append(item)
            continue
        try:
            options[key] = typed_list(value) if key in ("input", "gpus") else value
        except yaml.YAMLError:
            raise LaunchError(f"--config {item}: give a list as [a,b]") from None
    if "gpus" in options:
        options["gpus"] = ",".join(options["gpus"])
    given = {"input": launch.inputs, "outdir": launch.outdir, "gpus": launch.gpus}
    given |= {"model": launch.model}
    for key, value in options.items():
        if given[key] not in (None, [], "auto", value):
            raise LaunchError(
                f"--config {key}= and the option for {key} say different things; give one"
            )
    fields = {"inputs" if key == "input" else key: value for key, value in options.items()}
    launch = launch._replace(config=rest, **fields)
    if not launch.inputs:
        raise LaunchError(
            "give the protein FASTA files to embed, e.g. esmshard run a.fasta -o out"
        )
    if not launch.outdir:
        raise LaunchError("give the folder for the outputs with -o OUTDIR")
    return launch


def snakemake_command(launch: Launch) -> list[str]:
    """The `snakemake` command line for `launch`, run from the current folder."""
    root = workflow_root()
    launch = with_config_options(launch)
    if "--config" in launch.snakemake_args or "-C" in launch.snakemake_args:
        raise LaunchError(
            "give config values to esmshard run's own --config, not after `--` (Snakemake "
            "keeps only the last --config, which would drop the input and outdir)"
        )
    config = [f"input={json.dumps(launch.inputs)}", f"outdir={launch.outdir}"]
    if launch.model:
        config.append(f"model={launch.model}")
    cmd = ["snakemake", "--snakefile", str(root / "Snakefile"), "--cores", launch.cores]
    if launch.profile:
        if launch.gpus != "auto":
            raise LaunchError(
                "--gpus goes with a workstation run; under --profile each embed job gets its "
                "GPU from the scheduler (leave --gpus out)"
            )
        cmd += ["--profile", str(profile_folder(launch.profile, root))]
    else:
        # One embed job per pool slot at once; a machine without GPUs computes on one CPU slot.
        gpus = gpu_list(launch.gpus)
        if gpus == "auto":
            slots = max(1, len(visible_devices()))
        else:
            slots = len(gpus)
            config.append(f"gpus={json.dumps(gpus).replace(' ', '')}")
        cmd += ["--resources", f"gpu={slots}"]
    # The workstation profile that a clone's `snakemake` finds by itself: resume, keep going, and
    # re-run only on changed inputs and settings (`--rerun-triggers mtime params input`).
    cmd += ["--workflow-profile", str(root / "profiles" / "default")]
    cmd += ["--config", *config, *launch.config, *launch.snakemake_args]
    return cmd


def snakemake_executable() -> str:
    """Find this environment's snakemake, beside this Python, ahead of any other on PATH."""
    # Beside sys.executable: `.venv/bin/esmshard` typed outside an activated venv finds it too.
    beside = Path(sys.executable).parent / "snakemake"
    executable = str(beside) if beside.is_file() else shutil.which("snakemake")
    if executable is None:
        raise LaunchError("snakemake is not installed here; pip install esmshard installs it")
    return executable


def run(launch: Launch) -> int:
    """Print the command, then run it: with esmshard's own view of it (esmshard.commands.console),
    or, with `verbose` or Snakemake options after `--`, as Snakemake shows it (this process
    becomes Snakemake: its signals and exit status)."""
    cmd = snakemake_command(launch)
    print(f"esmshard run: {DEFAULTS_ENV}=1 " + shlex.join(cmd), file=sys.stderr, flush=True)
    executable = snakemake_executable()
    os.environ[DEFAULTS_ENV] = "1"
    os.environ[TYPED_COMMAND_ENV] = shlex.join(["esmshard", *sys.argv[1:]])
    if launch.verbose or launch.snakemake_args:
        os.execv(executable, [executable, *cmd[1:]])
    from .console import LOG_EVERY_SECONDS, run_quietly

    outdir = with_config_options(launch).outdir
    every = launch.progress_every or LOG_EVERY_SECONDS
    return run_quietly([executable, *cmd[1:]], dict(os.environ), outdir, every)
