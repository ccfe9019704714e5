"""The commands of the README and docs/outputs.md, run as they show them (a random-weight model
instead of downloaded weights; test_docs checks every other command the docs show)."""

import gzip
import html
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import h5py
import pytest
from helpers import MODEL, PROTEINS, REPO, TINY_MODEL, doc_block, read_records

VENV = Path(sys.prefix)
ENV = {**os.environ, "PATH": f"{VENV / 'bin'}{os.pathsep}{os.environ['PATH']}"}
IDS = [h[1:].split()[0] for h, _ in read_records(PROTEINS)]


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> Path:
    """`make run` with a random-weight model, its outdir `results` in the folder returned (the
    docs read and export the results of `make run`)."""
    folder = tmp_path_factory.mktemp("made")
    args = f"--config model=random:{TINY_MODEL} outdir={folder / 'results'}"
    env = {**ENV, "ESMSHARD_POOL_DIR": str(folder / "pool")}
    result = subprocess.run(["make", "-C", str(REPO), "run", f"VENV={VENV}", f"ARGS={args}"], env=env,
                            capture_output=True, text=True)  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return folder


def test_make_run_writes_the_example_and_runs_the_workflow(tmp_path, made):
    env = {**ENV, "ESMSHARD_POOL_DIR": str(tmp_path / "pool")}
    example = REPO / "resources" / "ecoli_k12_example.fasta"
    with h5py.File(made / "results" / "embeddings.h5") as h5:
        assert h5["ids"].asstr()[:].tolist() == [
            h[1:].split()[0] for h, _ in read_records(example)
        ]
        assert len(h5["ids"]) == 291 and h5.attrs["weights"] == "random"
    # Without a model named, it says first that the default model downloads its weights.
    dry = subprocess.run(["make", "-C", str(REPO), "run", f"VENV={VENV}", "ARGS=--dry-run"], env=env,
                         capture_output=True, text=True)  # fmt: skip
    assert dry.returncode == 0, dry.stderr[-2000:]
    first = next(line for line in dry.stdout.splitlines() if line.startswith("esmshard"))
    assert "esm2_t33_650M_UR50D, downloads its weights" in first
    assert 'make run ARGS="--config model=random:esm2_t6_8M_UR50D"' in first


def test_make_run_with_its_own_input_needs_no_example_and_no_network(tmp_path):
    """The README's form for a machine without network: the example is neither found nor
    downloaded (no data folder, no route out), and the run embeds the input it names."""
    (tmp_path / "proteins.fasta").write_text(PROTEINS.read_text())
    args = (f"--config model=random:{TINY_MODEL} input={tmp_path / 'proteins.fasta'} "
            f"outdir={tmp_path / 'results'}")  # fmt: skip
    offline = {**ENV, "ESMSHARD_POOL_DIR": str(tmp_path / "pool"), "ESMSHARD_DATA": str(tmp_path),
               "https_proxy": "http://127.0.0.1:9", "http_proxy": "http://127.0.0.1:9"}  # fmt: skip
    absent = tmp_path / "example.fasta"  # where this make would write the example
    done = subprocess.run(["make", "-C", str(REPO), "run", f"VENV={VENV}", f"EXAMPLE={absent}",
                           f"ARGS={args}"], env=offline, capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert not absent.exists() and "cannot download" not in done.stderr
    with h5py.File(tmp_path / "results" / "embeddings.h5") as h5:
        assert h5["ids"].asstr()[:].tolist() == IDS


def test_running_command_as_the_readme_types_it(tmp_path):
    with gzip.open(tmp_path / "proteome.fasta.gz", "wt") as fh:
        fh.write(PROTEINS.read_text())
    env = {**ENV, "ESMSHARD_POOL_DIR": str(tmp_path / "pool")}
    (command,) = [
        c for c in doc_block("README.md", "**From a clone**").splitlines() if "outdir" in c
    ]
    # From a clone's root, where `snakemake` finds the Snakefile; random weights, no download.
    cmd = shlex.split(command)
    cmd[1:1] = ["-s", str(REPO / "Snakefile")]
    result = subprocess.run([*cmd, f"model={MODEL}"], cwd=tmp_path, env=env,
                            capture_output=True, text=True)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    with h5py.File(tmp_path / "out" / "embeddings.h5") as h5:
        assert h5["ids"].asstr()[:].tolist() == IDS


def test_esmshard_run_and_status_as_the_readme_types_them(tmp_path):
    with gzip.open(tmp_path / "proteome.fasta.gz", "wt") as fh:
        fh.write(PROTEINS.read_text())
    env = {**ENV, "ESMSHARD_POOL_DIR": str(tmp_path / "pool")}
    run, status = doc_block("README.md", "**Installed**").splitlines()
    result = subprocess.run([*shlex.split(run), "--model", MODEL], cwd=tmp_path,
                            env=env, capture_output=True, text=True)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "--resources gpu=2" in result.stderr.splitlines()[0]
    with h5py.File(tmp_path / "out" / "embeddings.h5") as h5:
        assert h5["ids"].asstr()[:].tolist() == IDS
        assert set(h5["mean"]) == {"6"} and set(h5["per_tok"]) == {"6", "offsets"}
    # the report's command is the one typed, the Snakemake command it ran folded below it
    page = html.unescape((tmp_path / "out" / "report" / "scaling_report.html").read_text())
    typed = shlex.join([*shlex.split(run), "--model", MODEL])
    assert f"<td class=label>command</td><td class=text>{typed}</td>" in page
    assert "<details><summary>The snakemake command that esmshard run ran</summary>" in page

    watch = subprocess.Popen(shlex.split(status), cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                             text=True)  # fmt: skip
    first = watch.stdout.readline()  # its first frame drawn (a finished run's is its last)
    watch.send_signal(signal.SIGINT)
    out = first + watch.stdout.read()  # what the reader holds of the frame, then to the end
    watch.wait(timeout=10)
    # --gpus 0,1: one shard per GPU of the pool (shards: auto)
    assert watch.returncode == 0 and "finished" in out and "shards 2/2 (100%)" in out


def run_python_block(page: str, after: str, cwd: Path) -> subprocess.CompletedProcess:
    """The first Python block after `after` in `page`, run as a script in `cwd`; it succeeds."""
    code = doc_block(page, after, "```python\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=cwd, env=ENV, capture_output=True,
                          text=True)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def test_embedding_from_python_as_the_readme_shows(tmp_path):
    example = tmp_path / "resources" / "ecoli_k12_example.fasta"
    subprocess.run([sys.executable, "-m", "esmshard.input.datasets", "example", str(example)], env=ENV,
                   check=True)  # fmt: skip
    for _ in range(2):  # the second time from the store
        done = run_python_block("README.md", "**From Python**", tmp_path)
        assert done.stdout.strip() == "291 (291, 320) (320,)"
    assert len(list((tmp_path / "store").rglob("*.h5"))) == 1


def test_reading_and_exporting_as_the_docs_show(made):
    # the docs' commands run beside the results of `make run`
    read = run_python_block("docs/outputs.md", "## Reading and exporting", made)
    assert "291 proteins; kinds and layers: {'mean': [6]}" in read.stdout
    assert "256 sp|" in read.stdout and "torch.Size([64, 320])" in read.stdout

    commands = doc_block("docs/outputs.md", "esmshard export OUTDIR --format FORMAT").splitlines()
    assert len(commands) == 8
    for command in commands:
        done = subprocess.run(shlex.split(command), cwd=made, env=ENV, capture_output=True,
                              text=True)  # fmt: skip
        assert done.returncode == 0 and "291/291 proteins (100%)" in done.stderr, done.stderr
        assert (made / shlex.split(command)[-1]).exists()
    read = run_python_block("docs/outputs.md", "The Parquet dataset is read in place", made)
    assert "291 rows; columns: ['id', 'sequence_sha256', 'length', 'mean_6']" in read.stdout
    assert "RHSB_ECOLI    1022" in read.stdout and "mean length 317.78" in read.stdout
