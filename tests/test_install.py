"""esmshard installed as its users install it: the built sdist and wheel; `make wheelhouse` and
a fresh virtualenv with torch that installs from it with no network (a GPU node's install), and
`make gpu-check` in it;
`esmshard run` from an empty folder outside the repository, and the workflow catalog's
deployment (`esmshard deploy`) of a tagged clone, run with the installed package."""

import gzip
import json
import os
import re
import shlex
import subprocess
import sys
import zipfile
from pathlib import Path

import h5py
import numpy as np
import pytest
from helpers import (
    DATA,
    PROTEINS,
    REPO,
    TINY_MODEL,
    clone_of_workflow,
    doc_block,
    read_records,
    tracked_files,
)

import esmshard

VERSION = esmshard.__version__
MODEL = f"random:{TINY_MODEL}"
IDS = [h[1:].split()[0] for h, _ in read_records(PROTEINS)]
# The workflow's files, which the wheel must hold (setup.py copies them into the package).
WORKFLOW_FILES = ("Snakefile", "workflow/", "config/", "profiles/", "envs/")


def run(cmd, cwd, env, check=True):
    result = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    if check and result.returncode != 0:
        raise AssertionError(f"{cmd} failed ({result.returncode}):\n{result.stderr[-4000:]}")
    return result


def torch_spec() -> str:
    """The torch that `make` installs (TORCH in the Makefile, or from the environment)."""
    if os.environ.get("TORCH"):
        return os.environ["TORCH"]
    return re.search(r"^TORCH \?= (.+)$", (REPO / "Makefile").read_text(), re.M).group(1)


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> Path:
    """The sdist and the wheel built from it, from the repository's tracked files."""
    source = clone_of_workflow(tmp_path_factory.mktemp("source"))
    out = tmp_path_factory.mktemp("dist")
    run([sys.executable, "-m", "build", "--outdir", str(out), str(source)], source, os.environ)
    return out


@pytest.fixture(scope="module")
def wheelhouse(tmp_path_factory) -> Path:
    """`make wheelhouse` where there is network: esmshard's wheel and its dependencies'."""
    folder = tmp_path_factory.mktemp("node") / "wheelhouse"
    python = "%d.%d" % sys.version_info[:2]
    run(["make", "-C", str(REPO), "wheelhouse", f"PY={python}", f"WHEELHOUSE={folder}"], REPO,
        os.environ)  # fmt: skip
    return folder


# No index, no pip configuration (its local find-links included), and a dead proxy: any attempt
# to reach the network fails.
OFFLINE = {
    **os.environ,
    "PIP_CONFIG_FILE": os.devnull,
    "PIP_NO_INDEX": "1",
    "HTTPS_PROXY": "http://127.0.0.1:9",
    "HTTP_PROXY": "http://127.0.0.1:9",
}
OFFLINE_INSTALL = doc_block("docs/install.md", "**GPU nodes without network.**").strip()


@pytest.fixture(scope="module")
def venv(wheelhouse, dist) -> Path:
    """A GPU node's fresh virtualenv: torch as `make` takes it, then esmshard and every
    dependency from the wheelhouse with no network, by the docs' command; then esmshard again
    from the built wheel, as the README installs it (its dependencies already there)."""
    path = wheelhouse.parent / "venv"
    base_python = getattr(sys, "_base_executable", sys.executable)
    run([base_python, "-m", "venv", str(path)], path.parent, os.environ)
    pip = [str(path / "bin" / "python"), "-m", "pip"]
    run([*pip, "install", "--quiet", torch_spec()], path.parent, os.environ)
    run([*pip, *shlex.split(OFFLINE_INSTALL)[1:]], wheelhouse.parent, OFFLINE)
    run([*pip, "uninstall", "--yes", "esmshard"], path.parent, os.environ)
    run([*pip, "install", "--quiet", str(next(dist.glob("*.whl")))], path.parent, OFFLINE)
    return path


def env_of(venv: Path, pool: Path, **extra) -> dict:
    """The environment of a user whose shell has the virtualenv active (and no clone on PATH)."""
    path = [p for p in os.environ["PATH"].split(os.pathsep) if not p.startswith(str(REPO))]
    return {
        **{k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
        "PATH": os.pathsep.join([str(venv / "bin"), *path]),
        "VIRTUAL_ENV": str(venv),
        "ESMSHARD_POOL_DIR": str(pool),
        **extra,
    }


def test_make_wheel_writes_the_wheel_the_readme_installs(tmp_path):
    """The README's install table: `make wheel` in a clone writes dist/<the file it names>."""
    clone = clone_of_workflow(tmp_path / "clone")
    (clone / ".venv").symlink_to(REPO / ".venv")  # up to date: make installs nothing
    done = subprocess.run(["make", "wheel"], cwd=clone, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    wheel = f"esmshard-{VERSION}-py3-none-any.whl"
    assert (clone / "dist" / wheel).is_file() and f"dist/{wheel}" in done.stdout
    assert f"`make wheel` in a clone writes `dist/{wheel}`" in (REPO / "README.md").read_text()
    with zipfile.ZipFile(clone / "dist" / wheel) as built:
        assert "esmshard/workflow_files/workflow/rules/common.smk" in built.namelist()


def test_makes_virtualenv_imports_esmshard_in_a_folder_beside_a_clone_named_esmshard(tmp_path):
    """make's install imports from any folder: where the folder holds the clone `esmshard` (as
    the README clones it), setuptools' import hook let Python take that for an empty
    namespace package; the clone's own folder on the path does not (this suite runs in make's
    .venv)."""
    (tmp_path / "esmshard").mkdir()  # a clone's top folder: no __init__.py
    done = subprocess.run([sys.executable, "-c", "import esmshard; esmshard.embed"], cwd=tmp_path,
                          capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 0, done.stderr


def test_the_sdist_and_the_wheel_hold_the_workflow(dist):
    workflow = {f for f in tracked_files() if f.startswith(WORKFLOW_FILES)}
    assert "workflow/rules/common.smk" in workflow and "profiles/lsf/config.yaml" in workflow
    with zipfile.ZipFile(next(dist.glob("*.whl"))) as wheel:
        names = set(wheel.namelist())
    shipped = {n.removeprefix("esmshard/workflow_files/") for n in names}
    assert workflow | {"esmshard/version.py"} <= shipped
    assert {f"esmshard/{p.relative_to(REPO / 'esmshard')}" for p in
            (REPO / "esmshard").rglob("*.py")} <= names  # fmt: skip
    sdist = next(dist.glob("*.tar.gz")).name
    assert sdist == f"esmshard-{VERSION}.tar.gz"


def test_the_wheelhouse_installs_offline_next_to_torch(wheelhouse, venv):
    names = {path.name.split("-")[0].lower() for path in wheelhouse.glob("*.whl")}
    assert {"esmshard", "snakemake", "fair_esm", "snakemake_executor_plugin_slurm"} <= names
    assert {"pytest", "transformers"} <= names  # what `make gpu-check` imports
    assert "torch" not in names and not any(n.startswith("nvidia_cu") for n in names)
    assert OFFLINE_INSTALL == "pip install --no-index --find-links wheelhouse 'esmshard[cluster]'"
    modules = "esm, esmshard.steps.embed, esmshard.steps.merge, snakemake_executor_plugin_slurm"
    run([str(venv / "bin" / "python"), "-c", f"import {modules}"], venv, os.environ)
    version = run([str(venv / "bin" / "snakemake"), "--version"], venv, os.environ)
    assert version.stdout.startswith("9.")
    run([str(venv / "bin" / "esmshard"), "status", "--help"], venv, os.environ)


# What docs/install.md says to install from the wheelhouse where `make gpu-check` runs.
GPU_CHECK_EXTRA = re.search(r"imports \(pytest, transformers\): install\s+`([^`]+)`",
                            (REPO / "docs" / "install.md").read_text()).group(1)  # fmt: skip


def test_make_gpu_check_runs_in_a_gpu_nodes_python_with_the_wheelhouse_and_says_no_gpu(
    tmp_path, wheelhouse, venv
):
    """The GPU node's route, as docs/benchmarks.md types it: the gpu-check extra from the
    wheelhouse with no network, then `make gpu-check GPU_PYTHON=python3` from a fresh clone's
    root (the default GPU_CHECK_OUT is the relative path gpu-check), the data beside the clone
    as CI's clone has them; here, with no GPU, the same plumbing on a small model."""
    assert GPU_CHECK_EXTRA == "'esmshard[cluster,gpu-check]'"
    install = OFFLINE_INSTALL.replace("'esmshard[cluster]'", GPU_CHECK_EXTRA)
    env = env_of(venv, tmp_path / "pool")  # the node's Python first on PATH: its python3
    run(shlex.split(install), wheelhouse.parent, {**OFFLINE, "PATH": env["PATH"]})
    clone = clone_of_workflow(tmp_path / "esmshard")  # named as the README clones it
    (tmp_path / "shared").mkdir()
    (tmp_path / "shared" / "data").symlink_to(DATA)
    done = run(["make", "gpu-check", "GPU_PYTHON=python3"], clone, env, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "is not installed" not in done.stdout and not (clone / ".venv").exists()
    out = clone / "gpu-check"
    result = json.loads((out / "gpu-check.json").read_text())
    assert result["ok"] and result["environment"]["gpu"] is False
    tests = result["tests"]
    assert tests["skipped"] >= 6 and tests["passed"] == tests["failed"] == 0
    (whole,) = result["workflows"].values()  # ESM-2's; ESM C's whole run is the GPU plan's
    assert whole["ok"] and whole["shards"] >= 1 and whole["devices"] == ["cpu"]
    assert whole["command"].startswith("snakemake ") and "gpus=auto" in whole["command"]
    assert 0 < whole["host_fraction"] < 1
    assert (
        0
        < whole["whole_shard_tokens_per_s_with_loading"]
        < whole["whole_shard_tokens_per_s_loaded"]
    )
    assert whole["compile_cache"] == ["off"] and whole["compile_seconds"] == 0  # auto: off on CPUs
    sides = {row["side"]: row for row in result["throughput"]["rows"] if "side" in row}
    assert set(sides) == {"fair-esm", "esmshard"}
    assert sides["esmshard"]["speedup_vs_peer"] > 0
    peers = {(r["model"], r["side"], r["precision"]): r for r in result["peers"]["rows"]}
    assert set(peers) == {
        ("esm2_t6_8M_UR50D", "fair-esm", "fp32"),
        ("esm2_t6_8M_UR50D", "fair-esm", "bf16"),
        ("esm2_t6_8M_UR50D", "transformers EsmModel (SDPA)", "bf16"),
        ("esm2_t6_8M_UR50D", "esmshard padded", "bf16"),
        ("esm2_t6_8M_UR50D", "esmshard packed", "bf16"),
        ("esm2_t6_8M_UR50D", "esmshard packed compiled", "bf16"),
        ("esmc_300m", "transformers EsmcModel (SDPA)", "bf16"),
        ("esmc_300m", "esmshard packed", "bf16"),
        ("esmc_300m", "esmshard packed compiled", "bf16"),
    } | {  # FP8's products: on CPUs too, in each recipe
        (model, side, recipe)
        for model in ("esm2_t6_8M_UR50D", "esmc_300m")
        for side in ("esmshard packed", "esmshard packed compiled")
        for recipe in ("fp8", "fp8-feed-forward")
    }
    assert all(r["tokens_per_s"] > 0 and 0 < r["share_of_peak"] < 1 for r in peers.values())
    # the packed sides' profile, class by class: on a CPU its operations, the products and the
    # attention most of the time (which of the two leads depends on the machine's load)
    profiled = {(r["side"], r["precision"]): r for r in result["peers"]["rows"]
                if "profiled_seconds" in r}  # fmt: skip
    assert {side for side, _ in profiled} == {"esmshard packed", "esmshard packed compiled"}
    for side in ("esmshard packed", "esmshard packed compiled"):
        spent = profiled[side, "bf16"]["seconds_by_class"]
        assert spent["products"] > 0 and spent["attention"] > 0, spent
        assert spent["products"] + spent["attention"] > 0.5 * sum(spent.values()), spent
    assert all(r["host_gap_seconds"] is None for r in profiled.values())  # a GPU's alone
    assert peers["esm2_t6_8M_UR50D", "fair-esm", "fp32"]["speedup_vs_baseline"] == 1
    compiled = peers["esm2_t6_8M_UR50D", "esmshard packed compiled", "bf16"]
    assert compiled["compiled_graphs"] >= 1 and compiled["compile_seconds"] > 0
    for model in ("esm2_t6_8M_UR50D", "esmc_300m"):
        fp8, feed_forward = (peers[model, "esmshard packed compiled", recipe]
                             for recipe in ("fp8", "fp8-feed-forward"))  # fmt: skip
        assert 0.99 < fp8["cosine_min_per_protein_vs_fp32"] < 1
        assert 0.99 < fp8["cosine_p1_vs_fp32"] < 1
        # the attention's products in bf16: less of FP8's error
        assert fp8["cosine_p1_vs_fp32"] < feed_forward["cosine_p1_vs_fp32"] < 1
    # the largest models' code on their stand-ins (the 3B, 15B and ESM C 6B on a GPU), then
    # nearest neighbours, last
    assert result["stages"][-2:] == ["largest", "neighbours"] and result["largest"]["ok"]
    (searched,) = result["neighbours"]["rows"]
    assert searched["sample_equal_to_whole_matrix"] and searched["reference"] == 20000
    big = {(r["model"], r["precision"]): r for r in result["largest"]["rows"]}
    assert set(big) == {("esm2_t6_8M_UR50D", "bf16"), ("esmc_300m", "bf16")}
    assert all(r["layers"] == 1 and r["tokens_per_s"] > 0 for r in big.values())
    assert all(r["compiled_graphs"] >= 1 and r["build_seconds"] > 0 for r in big.values())
    # bf16 against fp32 on the same random weights (one layer: bf16's rounding alone)
    assert all(0.999 < r["cosine_p1_vs_fp32"] < 1 for r in big.values())
    masked = {r["side"]: r for r in result["masked_marginals"]["rows"] if "tokens_per_s" in r}
    assert set(masked) == {"predict.py loop", "esmshard padded", "esmshard packed"}  # no CUDA
    assert all(r["masked_tokens"] > 0 and r["tokens_per_s"] > 0 for r in masked.values())
    (scan,) = [r for r in result["masked_marginals"]["rows"] if "extrapolated" in r]
    assert scan["side"] in masked and scan["this_device_hours"] > 0
    page = (out / "gpu-check.md").read_text()
    assert "**No GPU was found**" in page and "Verdict: **pass**" in page
    assert "## Masked marginals" in page and "| esmshard packed | fp32 |" in page
    assert "## Peers side by side" in page and "transformers EsmcModel (SDPA)" in page
    (profiled_line,) = [
        line for line in page.splitlines()
        if line.startswith("- esm2_t6_8M_UR50D, esmshard packed (bf16): ")
    ]  # fmt: skip
    assert "products " in profiled_line and "attention " in profiled_line  # classes, by time
    largest = page[page.index("## The largest models") :]
    assert (
        "esmc_300m (1 layer), esmshard packed compiled (bf16): " in largest
        and " tokens/s; per-residue cosine to fp32 0.99" in largest
        and " at the 1st percentile; built with random weights on the device in " in largest
    )
    assert "Stages:" not in page  # all of them
    assert "## Nearest neighbours" in page and "a sample equal to every distance: yes" in page
    said = [line for line in page.splitlines() if " against fp32: " in line]
    assert [line.split(" against")[0] for line in said] == [
        f"{model} in {recipe}"
        for model in ("esm2_t6_8M_UR50D", "esmc_300m")
        for recipe in ("fp8", "fp8-feed-forward")
    ]
    for line in said:
        assert " against fp32: per-residue cosine 0.99" in line
        assert "(goal 0.9997)" in line and "× bf16's tokens/s (goal 1.3×)." in line


def test_the_wheel_runs_from_an_empty_folder_as_snakemake_does_in_a_clone(tmp_path, venv):
    version = run([str(venv / "bin" / "esmshard"), "--version"], tmp_path, os.environ)
    assert version.stdout.strip() == f"esmshard {VERSION}"
    helped = run([str(venv / "bin" / "esmshard"), "run", "--help"], tmp_path, os.environ).stdout
    for option in ("--outdir", "--gpus", "--model", "--profile", "--config", "--cores"):
        assert option in helped

    folder = tmp_path / "anywhere"
    folder.mkdir()
    (folder / "proteins.fasta").write_text(PROTEINS.read_text())
    settings = ["repr_layers=[-1,3]", "include=[mean,per_tok]"]
    done = run(["esmshard", "run", "proteins.fasta", "-o", "out", "--gpus", "0", "--model", MODEL,
                "--config", *settings], folder, env_of(venv, tmp_path / "pool"))  # fmt: skip
    printed = done.stderr.splitlines()[0]
    site = next((venv / "lib").glob("python3*/site-packages"))
    assert printed.startswith(
        f"esmshard run: ESMSHARD_WORKFLOW_CONFIG=1 snakemake --snakefile "
        f"{site}/esmshard/workflow_files/Snakefile "
        "--cores all --resources gpu=1 "
    )
    assert f"esmshard: {len(IDS)} records" in done.stderr

    # The same settings through `snakemake` in the clone, as its README shows.
    clone = tmp_path / "clone"
    clone.mkdir()
    (clone / "proteins.fasta").write_text(PROTEINS.read_text())
    run(["snakemake", "-s", str(REPO / "Snakefile"), "--cores", "all", "--resources", "gpu=1",
         "--config", "input=proteins.fasta", "outdir=out", f"model={MODEL}", "gpus=[0]",
         *settings], clone, {**os.environ, "ESMSHARD_POOL_DIR": str(tmp_path / "pool")})  # fmt: skip

    with h5py.File(folder / "out" / "embeddings.h5") as wheel_h5, \
            h5py.File(clone / "out" / "embeddings.h5") as clone_h5:  # fmt: skip
        assert wheel_h5["ids"].asstr()[:].tolist() == IDS
        assert wheel_h5.attrs["esmshard_version"] == VERSION
        datasets = []
        clone_h5.visititems(
            lambda name, obj: datasets.append(name) if isinstance(obj, h5py.Dataset) else None
        )
        assert {"ids", "mean/6", "mean/3", "per_tok/3", "per_tok/6"} <= set(datasets)
        for name in datasets:
            assert np.array_equal(wheel_h5[name][:], clone_h5[name][:]), name
    run_json = json.loads((folder / "out" / "run.json").read_text())
    assert run_json["esmshard_version"] == VERSION and run_json["computed"] == len(IDS)
    report = json.loads((folder / "out" / "report" / "scaling.json").read_text())
    assert report["esmshard_version"] == VERSION


DEPLOY, RUN_DEPLOYED = doc_block("README.md", "**Deployed**").splitlines()


@pytest.fixture(scope="module")
def deployed(tmp_path_factory, venv) -> Path:
    """The workflow catalog's deployment of a tagged clone, by the README's command, typed in
    the folder that holds the clone `esmshard` (the README clones into it)."""
    parent = tmp_path_factory.mktemp("user")
    clone = clone_of_workflow(parent / "esmshard")
    git = ["git", "-c", "user.name=esmshard", "-c", "user.email=esmshard@localhost"]
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "release"],
                 ["tag", f"v{VERSION}"]):  # fmt: skip
        run([*git, *args], clone, os.environ)
    run(["bash", "-c", DEPLOY], parent, env_of(venv, parent / "pool"))
    folder = parent / "deployed"
    with gzip.open(folder / "proteome.fasta.gz", "wt") as fh:
        fh.write(PROTEINS.read_text())
    return folder


def deployed_clone(folder: Path) -> Path:
    """The clone a deployment's module points at (git+file://<clone>/workflow/Snakefile@tag)."""
    text = (folder / "workflow" / "Snakefile").read_text()
    return Path(re.search(r'"git\+file://(.+)/workflow/Snakefile@', text).group(1))


def deployed_run(folder: Path, env: dict):
    """The README's command in the deployment, with random weights and the one CPU slot."""
    command = f"{RUN_DEPLOYED} model={MODEL} 'gpus=[0]'"
    return run(["bash", "-c", command], folder.parent, env, check=False)


def test_a_deployed_workflow_runs_with_the_installed_package(tmp_path, venv, deployed):
    assert {p.name for p in deployed.iterdir()} >= {"workflow", "config", "profiles"}
    done = deployed_run(deployed, env_of(venv, tmp_path / "pool"))
    assert done.returncode == 0, done.stderr[-4000:]
    # The run lock and the closing summary hold in a module too.
    assert f"esmshard: {len(IDS)} records" in done.stderr
    assert (deployed / "results" / ".esmshard" / "run.lock").exists()
    with h5py.File(deployed / "results" / "embeddings.h5") as h5:
        assert h5["ids"].asstr()[:].tolist() == IDS
        assert h5.attrs["esmshard_version"] == VERSION


def test_a_deployed_workflow_names_the_esmshard_version_it_needs_and_where_pip_finds_it(
    tmp_path, venv, deployed, dist
):
    clone = deployed_clone(deployed)
    advice = f"pip install 'git+file://{clone}@v{VERSION}'"
    other = tmp_path / "other" / "esmshard"
    other.mkdir(parents=True)
    (other / "__init__.py").write_text('__version__ = "0.0.1"\n')
    env = env_of(venv, tmp_path / "pool")
    done = deployed_run(deployed, {**env, "PYTHONPATH": str(other.parent)})
    assert done.returncode != 0
    assert (
        f"this workflow needs esmshard {VERSION}, but esmshard 0.0.1 is installed "
        f"({other}): {advice}"
    ) in done.stderr, done.stderr[-3000:]

    pip = [str(venv / "bin" / "python"), "-m", "pip"]
    run([*pip, "uninstall", "--yes", "esmshard"], tmp_path, os.environ)
    try:
        done = deployed_run(deployed, env)
        assert done.returncode != 0
        assert (
            f"this workflow needs esmshard {VERSION}, which is not installed in the Python "
            f"that runs Snakemake ({venv}/bin/python"
        ) in done.stderr, done.stderr[-3000:]
        assert f"{advice} there" in done.stderr, done.stderr[-3000:]
        # The advice as typed, in the Python that runs Snakemake: the release from its tag.
        run(["bash", "-c", f"{advice} --quiet --no-deps"], tmp_path, env)
        assert deployed_run(deployed, env).returncode == 0
    finally:
        run([*pip, "install", "--quiet", "--no-deps", "--force-reinstall",
             str(next(dist.glob("*.whl")))], tmp_path, os.environ)  # fmt: skip


def test_makes_install_of_the_clone_prints_no_setuptools_warning_block(tmp_path):
    """The editable install as make types it (`make -n`): setuptools' 13-line block on the
    compat mode, which make chooses, is not printed on each make."""
    clone = clone_of_workflow(tmp_path / "clone")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    planned = subprocess.run(["make", "-n", f"VENV={venv}", f"{venv}/.lint-tools"], cwd=clone,
                             capture_output=True, text=True, check=True).stdout  # fmt: skip
    (install,) = [line for line in planned.splitlines() if line.endswith('-e ".[cluster]"')]
    done = subprocess.run(f"{install} --no-deps", shell=True, cwd=clone, capture_output=True,
                          text=True)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Compat editable" not in done.stderr and "!!" not in done.stderr, done.stderr
