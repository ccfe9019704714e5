"""`esmshard deploy`: a local clone deployed as the workflow catalog lays it out (the deployed
run itself: tests/test_install.py)."""

import subprocess
import sys
from pathlib import Path

from helpers import clone_of_workflow, read_only

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


def test_a_users_config_and_profile_are_kept_and_esmshards_written_beside_them(tmp_path):
    clone = clone_of_workflow(tmp_path / "esmshard")
    deployed = tmp_path / "deployed"
    mine = {
        deployed / "config" / "config.yaml": b"outdir: my-results\r\nmodel: esm2_t12_35M_UR50D\n",
        deployed / "profiles" / "default" / "config.yaml": b"cores: 7\n",
        deployed / "notes.txt": b"my notes\n",
    }
    for path, content in mine.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
    done = esmshard(tmp_path, "deploy", "esmshard", "deployed")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "esmshard deploy: kept your deployed/config/config.yaml; esmshard's is beside it: "
        "deployed/config/config.esmshard-new.yaml",
        "esmshard deploy: kept your deployed/profiles/default/config.yaml; esmshard's is beside "
        "it: deployed/profiles/default/config.esmshard-new.yaml",
        "esmshard deploy: wrote deployed/workflow/Snakefile; edit deployed/config/config.yaml",
    ]
    assert {path: path.read_bytes() for path in mine} == mine
    for name in ("config/config", "profiles/default/config"):
        new = (deployed / f"{name}.esmshard-new.yaml").read_bytes()
        assert new == (clone / f"{name}.yaml").read_bytes()
    assert (deployed / "profiles/slurm/config.yaml").read_bytes() == (
        clone / "profiles/slurm/config.yaml"
    ).read_bytes()  # where the user had none: esmshard's under its own name
    # A second deployment beside a first's files: refused, nothing written
    before = {p: p.read_bytes() for p in deployed.rglob("*") if p.is_file()}
    assert esmshard(tmp_path, "deploy", "esmshard", "deployed").returncode == 1
    assert {p: p.read_bytes() for p in deployed.rglob("*") if p.is_file()} == before


def test_a_file_or_a_read_only_folder_as_the_target_is_one_line(tmp_path):
    clone_of_workflow(tmp_path / "esmshard")
    (tmp_path / "a-file").write_text("mine\n")
    for target, said in (
        ("a-file", "a-file is a file; give a folder for the deployment"),
        ("a-file/deployed", "a-file/deployed is inside a-file, a file; give a folder for the "
         "deployment"),
    ):  # fmt: skip
        done = esmshard(tmp_path, "deploy", "esmshard", target)
        assert done.returncode == 1 and done.stderr == f"esmshard deploy: {said}\n"
    assert (tmp_path / "a-file").read_text() == "mine\n"
    shelf = tmp_path / "shelf"
    shelf.mkdir()
    (shelf / "mine.txt").write_text("mine\n")
    with read_only(shelf):
        done = esmshard(tmp_path, "deploy", "esmshard", "shelf/deployed")
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr == (
        "esmshard deploy: cannot write the deployment into shelf/deployed: Read-only file system "
        "(shelf/deployed); choose a folder you can write\n"
    )
    assert sorted(p.name for p in shelf.iterdir()) == ["mine.txt"]
