"""The executor profiles: each gives the embed and neighbours search jobs a GPU under the resource names its plugin
reads, as Snakemake itself resolves them from the profile (the plugins are not installed here:
the profile runs a dry run with the local executor instead)."""

import re
from types import SimpleNamespace

import pytest
import yaml
from helpers import (
    CLOUD,
    PROTEINS,
    REPO,
    S3_ENV,
    TINY_MODEL,
    doc_block,
    edited_cloud_profile,
    moto_server,
    refused_before_any_job,
    s3_client,
    snakemake,
)

# What each executor plugin reads for a job's GPU (from the plugins' sources: slurm's `gpu`
# -> --gpus; kubernetes needs gpu_manufacturer beside `gpu`; googlebatch reads nvidia_gpu;
# htcondor the submit command request_gpus; lsf passes only lsf_extra on to bsub).
GPU_RESOURCES = {
    "slurm": {"gpu": "1"},
    "kubernetes": {"gpu": "1", "gpu_manufacturer": "nvidia"},
    "googlebatch": {"nvidia_gpu": "1"},
    "awsbatch": {"_gpus": "1"},
    "htcondor": {"request_gpus": "1"},
    "lsf": {"lsf_extra": "-gpu num=1:mode=exclusive_process"},
}
GPU_NAMES = {name for resources in GPU_RESOURCES.values() for name in resources} - {"gpu"}


def test_every_shipped_cluster_profile_is_checked():
    shipped = {p.name for p in (REPO / "profiles").iterdir()} - {"default"}
    assert shipped == set(GPU_RESOURCES)


def job_resources(dry_run: str) -> dict[str, dict[str, str]]:
    """Each rule's resources in a dry run's job list (the last job of the rule listed)."""
    jobs = {}
    for rule, resources in re.findall(r"rule (\w+):\n(?:    .*\n)*?    resources: (.*)", dry_run):
        jobs[rule] = dict(item.split("=", 1) for item in resources.split(", "))
    return jobs


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    """A run folder whose shard step has run, so that a dry run lists the embed jobs."""
    workdir = tmp_path_factory.mktemp("sharded")
    config = {"input": [str(PROTEINS)], "model": f"random:{TINY_MODEL}", "shards": 2,
              "neighbours": "self"}  # fmt: skip
    snakemake(workdir, config, "--until", "shard")
    return workdir, config


def assert_gpu_resources(name: str, dry_run: str) -> None:
    jobs = job_resources(dry_run)
    assert {"embed", "neighbour_part", "merge", "report"} <= set(jobs), dry_run[-2000:]
    for rule in ("embed", "neighbour_part"):
        assert GPU_RESOURCES[name].items() <= jobs[rule].items(), rule
    for rule in ("merge", "report"):  # no GPU for the steps that need none
        assert not (GPU_NAMES | {"gpu"}) & set(jobs[rule])


@pytest.mark.parametrize("executor", sorted(set(GPU_RESOURCES) - set(CLOUD)))
def test_the_profile_gives_the_embed_jobs_a_gpu_as_its_plugin_reads_it(
    executor, sharded, tmp_path
):
    workdir, config = sharded
    profile = yaml.safe_load((REPO / "profiles" / executor / "config.yaml").read_text())
    assert profile.pop("executor") == executor
    assert profile["rerun-triggers"] == ["mtime", "params", "input"]
    copy = tmp_path / executor
    copy.mkdir()
    (copy / "config.yaml").write_text(yaml.safe_dump(profile))
    assert_gpu_resources(
        executor, snakemake(workdir, config, "--profile", str(copy), "--dry-run").stdout
    )


@pytest.fixture(scope="module")
def moto():
    with moto_server() as port:
        s3_client(port).create_bucket(Bucket="lab")
        yield port


@pytest.mark.parametrize("name", sorted(CLOUD))
def test_a_cloud_profile_runs_in_s3_and_gives_the_embed_jobs_a_gpu(name, moto, tmp_path):
    s3_client(moto).upload_file(str(PROTEINS), "lab", f"{name}/proteins.fasta")
    copy = edited_cloud_profile(name, f"s3://lab/{name}", moto, tmp_path / name)
    config = {"input": ["proteins.fasta"], "model": f"random:{TINY_MODEL}", "shards": 2,
              "neighbours": "self"}  # fmt: skip
    workdir = tmp_path / "run"
    snakemake(workdir, config, "--profile", str(copy), "--until", "shard", env=S3_ENV)
    dry_run = snakemake(workdir, config, "--profile", str(copy), "--dry-run", env=S3_ENV).stdout
    assert_gpu_resources(name, dry_run)


@pytest.mark.parametrize(
    "name, more", [(name, []) for name in sorted(CLOUD)] + [("kubernetes", ["--dry-run"])]
)
def test_a_cloud_profile_with_its_placeholders_is_refused_in_one_line(name, more, tmp_path):
    profile = yaml.safe_load((REPO / "profiles" / name / "config.yaml").read_text())
    for key in [k for k in profile if k.startswith(f"{CLOUD[name]}-")]:
        del profile[key]  # the plugin is not installed here: its own settings would not parse
    profile["executor"] = "cluster-generic"  # an executor that submits, installed here
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(profile))
    config = {"input": ["proteins.fasta"], "model": f"random:{TINY_MODEL}"}
    result = snakemake(tmp_path / "run", config, "--profile", str(tmp_path), *more, check=False)
    line = refused_before_any_job(result)
    assert "still holds placeholders" in line and "CHANGE-ME-bucket" in line, line


class Resources(dict):
    """A job's resources as the plugins read them (`.get` and attributes), numbers as numbers."""

    def __init__(self, resources: dict[str, str]):
        super().__init__({k: int(v) if v.isdigit() else v for k, v in resources.items()})

    __getattr__ = dict.__getitem__


@pytest.mark.parametrize("variant", ["cons_tres", "gres"])
def test_slurm_asks_for_the_gpu_by_gpus_or_by_gres_as_the_docs_show(variant, sharded, tmp_path):
    from snakemake_executor_plugin_slurm.utils import set_gres_string

    workdir, config = sharded
    profile = yaml.safe_load((REPO / "profiles" / "slurm" / "config.yaml").read_text())
    profile.pop("executor")
    if variant == "gres":
        documented = doc_block(
            "docs/clusters.md", "**Clusters without `cons_tres`.**", "```yaml\n"
        )
        profile.update(yaml.safe_load(documented))
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(profile))
    dry_run = snakemake(workdir, config, "--profile", str(tmp_path), "--dry-run").stdout
    embed = SimpleNamespace(resources=Resources(job_resources(dry_run)["embed"]))
    expected = " --gpus=1" if variant == "cons_tres" else " --gres=gpu:1"
    assert set_gres_string(embed) == expected
