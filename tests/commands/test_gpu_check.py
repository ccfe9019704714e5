"""`make gpu-check` on a machine without CUDA: the same plumbing, on a small model, says so."""

import json
import subprocess

from conftest import REPO


def test_gpu_check_runs_its_plumbing_on_a_cpu_and_says_no_gpu_was_found(tmp_path):
    out = tmp_path / "gpu-check"
    done = subprocess.run(
        ["make", "-C", str(REPO), "gpu-check", f"GPU_CHECK_OUT={out}"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads((out / "gpu-check.json").read_text())
    assert result["ok"] and result["environment"]["gpu"] is False
    tests = result["tests"]
    assert tests["skipped"] >= 6 and tests["passed"] == tests["failed"] == 0
    run = result["workflow"]
    assert run["ok"] and run["shards"] >= 1 and run["devices"] == ["cpu"]
    assert run["command"].startswith("snakemake ") and "gpus=auto" in run["command"]
    assert 0 < run["host_fraction"] < 1 and run["whole_shard_tokens_per_second"] > 0
    sides = {row["side"]: row for row in result["throughput"]["rows"] if "side" in row}
    assert set(sides) == {"fair-esm", "esmshard"}
    assert sides["esmshard"]["speedup_vs_peer"] > 0
    page = (out / "gpu-check.md").read_text()
    assert "**No GPU was found**" in page and "Verdict: **pass**" in page
