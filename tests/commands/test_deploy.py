"""`esmshard deploy`: a local clone deployed as the workflow catalog lays it out (the deployed
run itself: tests/test_install.py)."""

import subprocess
import sys
from pathlib import Path

from conftest import clone_of_workflow

ESMSHARD = Path(sys.executable).parent / "esmshard"


def esmshard(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([ESMSHARD, *args], cwd=cwd, capture_output=True, text=True)


def test_without_a_tag_the_deployment_reads_the_clones_files_and_keeps_its_own(tmp_path):
    clone = clone_of_workflow(tmp_path / "esmshard")
    done = esmshard(tmp_path, "deploy", "esmshard", "deployed")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == (
        "esmshard deploy: wrote deployed/workflow/Snakefile; edit deployed/config/config.yaml"
    )
    snakefile = (tmp_path / "deployed" / "workflow" / "Snakefile").read_text()
    assert f'"{clone}/workflow/Snakefile"' in snakefile
    for name in ("config/config.yaml", "profiles/slurm/config.yaml"):
        assert (tmp_path / "deployed" / name).read_text() == (clone / name).read_text()
    # a second deployment into the same folder would replace the user's edits: refused
    (tmp_path / "deployed" / "config" / "config.yaml").write_text("outdir: mine\n")
    again = esmshard(tmp_path, "deploy", "esmshard", "deployed")
    assert again.returncode == 1
    assert again.stderr == (
        "esmshard deploy: deployed holds a deployment already; choose another folder\n"
    )
    assert (tmp_path / "deployed" / "config" / "config.yaml").read_text() == "outdir: mine\n"


def test_a_missing_tag_or_a_folder_that_is_no_clone_is_one_line(tmp_path):
    clone = clone_of_workflow(tmp_path / "esmshard")
    subprocess.run(["git", "init", "-q"], cwd=clone, check=True)
    done = esmshard(tmp_path, "deploy", "esmshard", "deployed", "--tag", "v9.9.9")
    assert done.returncode == 1 and done.stderr == (
        f"esmshard deploy: {clone} has no tag v9.9.9 (`make release` in the clone makes the "
        "version's tag)\n"
    )
    (tmp_path / "other").mkdir()
    done = esmshard(tmp_path, "deploy", "other", "deployed")
    assert done.returncode == 1 and done.stderr == (
        f"esmshard deploy: {tmp_path / 'other'} is not a clone of esmshard (no workflow/Snakefile)\n"
    )
    assert not (tmp_path / "deployed").exists()
