import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "data"
PROTEINS = DATA / "ecoli_k12_40.fasta"
TINY_MODEL = "esm2_t6_8M_UR50D"


def snakemake_command(workdir: Path, config: dict, *args, env: dict | None = None):
    """The `snakemake` command line and environment of a run in `workdir` (the profile applies)."""
    workdir.mkdir(parents=True, exist_ok=True)
    cfg = workdir / "config.yaml"
    cfg.write_text(yaml.safe_dump(config))
    full_env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "ESMSHARD_POOL_DIR": str(workdir / "gpu-pool"),
        **(env or {}),
    }
    full_env = {k: v for k, v in full_env.items() if v is not None}  # None: unset it
    cmd = ["snakemake", "-s", str(REPO / "Snakefile"), "-d", str(workdir), "--configfile", str(cfg),
           "--cores", "8", "--set-threads", "embed=1", *args]
    return cmd, full_env


def snakemake(workdir: Path, config: dict, *args, env: dict | None = None, check: bool = True):
    """Run the workflow through the `snakemake` command line, as users do."""
    cmd, full_env = snakemake_command(workdir, config, *args, env=env)
    result = subprocess.run(cmd, cwd=REPO, env=full_env, capture_output=True, text=True)
    if check and result.returncode != 0:
        raise AssertionError(f"snakemake failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
    return result


def jobs_run(result) -> dict[str, int]:
    """Snakemake's job table ("Job stats") of a run: rule -> number of jobs."""
    text = result.stdout + result.stderr
    table = text[text.index("Job stats:"):].split("\n\n")[0]
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\w+)\s+(\d+)$", table, re.M) if m.group(1) != "total"}


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory) -> Path:
    """A random-weight ESM-2 (real t6 shapes) saved in fair-esm's on-disk format."""
    from esmshard.model import random_model, write_checkpoint

    return write_checkpoint(random_model(TINY_MODEL), tmp_path_factory.mktemp("weights"), TINY_MODEL)


def read_records(path: Path) -> list[tuple[str, str]]:
    """(header line, sequence) of each record of a plain FASTA file, as written."""
    records = []
    for line in path.read_text().splitlines():
        if line.startswith(">"):
            records.append([line, ""])
        else:
            records[-1][1] += line.strip()
    return [tuple(r) for r in records]
