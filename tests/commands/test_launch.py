"""`esmshard run`'s snakemake command (the runs themselves are in test_install and test_readme)."""

import pytest
from helpers import REPO

from esmshard.commands.cli import main
from esmshard.commands.launch import (
    Launch,
    LaunchError,
    snakemake_command,
    with_config_options,
    workflow_root,
)


def test_in_a_clone_the_workflow_is_the_clones_own():
    assert workflow_root() == REPO


def test_the_command_sets_the_pool_and_its_resources_from_the_gpu_list():
    cmd = snakemake_command(
        Launch(
            inputs=["a.fasta", "b c.fasta"],
            outdir="out",
            gpus="0,2",
            model="esm2_t6_8M_UR50D",
            config=["repr_layers=[-1,6]"],
            snakemake_args=["--dry-run"],
        )  # fmt: skip
    )
    assert cmd[:5] == ["snakemake", "--snakefile", str(REPO / "Snakefile"), "--cores", "all"]
    assert cmd[cmd.index("--resources") + 1] == "gpu=2"
    assert cmd[cmd.index("--workflow-profile") + 1] == str(REPO / "profiles" / "default")
    config = cmd[cmd.index("--config") + 1 :]
    assert config == ['input=["a.fasta", "b c.fasta"]', "outdir=out", "model=esm2_t6_8M_UR50D",
                      "gpus=[0,2]", "repr_layers=[-1,6]", "--dry-run"]  # fmt: skip


def test_config_keys_that_have_options_mean_the_same_as_the_options():
    typed = Launch([], None, config=["input=[a.fa,b c.fa]", "outdir=o", "gpus=[0,1]",
                                     "model=random:esmc_300m", "shards=2"])  # fmt: skip
    assert with_config_options(typed) == Launch(
        ["a.fa", "b c.fa"], "o", "0,1", "random:esmc_300m", config=["shards=2"]
    )
    assert with_config_options(Launch(["a.fa"], "o", config=["input=a.fa"])).inputs == ["a.fa"]


def test_without_gpus_the_pool_has_one_cpu_slot(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    cmd = snakemake_command(Launch(inputs=["a.fasta"], outdir="out"))
    assert cmd[cmd.index("--resources") + 1] == "gpu=1"
    assert not any(item.startswith("gpus=") for item in cmd)


def test_a_profile_is_named_or_given_as_a_folder(tmp_path):
    cmd = snakemake_command(Launch(inputs=["a.fasta"], outdir="out", profile="lsf"))
    assert cmd[cmd.index("--profile") + 1] == str(REPO / "profiles" / "lsf")
    assert "--resources" not in cmd  # the scheduler gives each embed job its GPU
    cmd = snakemake_command(Launch(inputs=["a.fasta"], outdir="out", profile=str(tmp_path)))
    assert cmd[cmd.index("--profile") + 1] == str(tmp_path)


@pytest.mark.parametrize(
    "launch, message",
    [
        (Launch(["a.fasta"], "out", gpus="0,x"), "--gpus 0,x: give device indices"),
        (Launch(["a.fasta"], "out", gpus="1,1"), "--gpus 1,1: give device indices"),
        (
            Launch(["a.fasta"], "out", profile="pbs"),
            "it ships: awsbatch, googlebatch, htcondor, kubernetes",
        ),
        (Launch(["a.fasta"], "out", profile="slurm", gpus="0"), "--gpus goes with a workstation"),
        (Launch(["a.fasta"], "out", config=["outdir=x"]), "--config outdir= and the option for"),
        (Launch([], "out"), "give the protein FASTA files to embed"),
        (Launch(["a.fasta"], None), "give the folder for the outputs with -o OUTDIR"),
        (Launch(["a.fasta"], "out", config=["shards"]), "--config shards: give KEY=VALUE"),
        (Launch(["a.fasta"], "out", snakemake_args=["--config", "a=1"]), "Snakemake keeps only"),
    ],
)
def test_what_cannot_work_is_refused_with_what_to_do(launch, message):
    with pytest.raises(LaunchError, match=message.replace("[", r"\[")):
        snakemake_command(launch)


def test_the_console_command_names_its_version_and_refuses_stray_options(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0 and capsys.readouterr().out.startswith("esmshard 0.")
    with pytest.raises(SystemExit) as exit_:
        main(["status", "out", "--", "-n"])
    assert exit_.value.code == 2 and "go with `esmshard run` only" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        main(["run", "a.fasta", "-o", "out", "--gpus", "x"])
    assert exit_.value.code == 2 and "esmshard run: --gpus x" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["0", "-3", "x", "1.5"])
def test_cores_that_cannot_work_are_refused_at_once(value, capsys):
    with pytest.raises(SystemExit) as stopped:
        main(["run", "proteins.fasta", "-o", "out", "--cores", value])
    assert stopped.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.endswith(
        f"argument --cores: {value!r}: give a number of cores of at least 1, or all"
    )


def test_the_help_names_every_profile_esmshard_ships(capsys):
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    shipped = sorted(p.name for p in (REPO / "profiles").iterdir() if p.name != "default")
    said = " ".join(capsys.readouterr().out.split())
    assert f"a cluster profile esmshard ships ({', '.join(shipped)})" in said
    assert "awsbatch" in shipped
