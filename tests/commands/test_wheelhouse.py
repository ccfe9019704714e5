"""The offline install: `make wheelhouse` where there is network, then pip with no index at all."""

import os
import shlex
import subprocess
import sys

from conftest import REPO, doc_block


def test_the_wheelhouse_installs_offline_next_to_torch(tmp_path):
    python = "%d.%d" % sys.version_info[:2]
    wheels = tmp_path / "wheelhouse"
    subprocess.run(
        ["make", "-C", str(REPO), "wheelhouse", f"PY={python}", f"WHEELHOUSE={wheels}"],
        check=True,
        capture_output=True,
    )
    names = {path.name.split("-")[0].lower() for path in wheels.glob("*.whl")}
    assert {"esmshard", "snakemake", "fair_esm", "snakemake_executor_plugin_slurm"} <= names
    assert "torch" not in names and not any(n.startswith("nvidia_cu") for n in names)

    # A node's environment with torch and nothing else (torch from where `make` takes it).
    venv = tmp_path / "node"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    node_python = str(venv / "bin" / "python")
    subprocess.run(
        [node_python, "-m", "pip", "install", "--quiet", "torch==2.13.0"],
        check=True,
        capture_output=True,
    )
    # No index, no pip configuration (its local find-links included), and a dead proxy: any
    # attempt to reach the network fails.
    offline = {
        **os.environ,
        "PIP_CONFIG_FILE": os.devnull,
        "PIP_NO_INDEX": "1",
        "HTTPS_PROXY": "http://127.0.0.1:9",
        "HTTP_PROXY": "http://127.0.0.1:9",
    }
    command = doc_block("docs/install.md", "**GPU nodes without network.**").strip()
    assert command == "pip install --no-index --find-links wheelhouse 'esmshard[cluster]'"
    install = subprocess.run(
        [node_python, "-m", *shlex.split(command)],  # the README's command, with the node's pip
        cwd=tmp_path,
        env=offline,
        capture_output=True,
        text=True,
    )
    assert install.returncode == 0, install.stdout + install.stderr
    check = subprocess.run(
        [
            node_python,
            "-c",
            "import esm, esmshard.steps.embed, esmshard.steps.merge, snakemake_executor_plugin_slurm",
        ],
        capture_output=True,
        text=True,
    )
    assert check.returncode == 0, check.stderr
    version = subprocess.run(
        [str(venv / "bin" / "snakemake"), "--version"], capture_output=True, text=True
    )
    assert version.returncode == 0 and version.stdout.startswith("9.")
    status = subprocess.run(
        [str(venv / "bin" / "esmshard"), "status", "--help"], capture_output=True, text=True
    )
    assert status.returncode == 0, status.stderr
