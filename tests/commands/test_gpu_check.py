"""`make gpu-check` on a machine without CUDA: the same plumbing, on a small model, says so."""

import json
import subprocess

from conftest import DATA, REPO, clone_of_workflow


def test_gpu_check_runs_its_plumbing_on_a_cpu_and_says_no_gpu_was_found(tmp_path):
    # As the docs type it: `make gpu-check`, no arguments, from a fresh clone's root (the
    # default GPU_CHECK_OUT is the relative path gpu-check). The clone shares this checkout's
    # virtualenv, which make finds up to date, and has the data beside it as CI's clone has.
    clone = clone_of_workflow(tmp_path / "clone")
    (tmp_path / "shared").mkdir()
    (tmp_path / "shared" / "data").symlink_to(DATA)
    (clone / ".venv").symlink_to(REPO / ".venv")
    done = subprocess.run(["make", "gpu-check"], cwd=clone, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "Nothing to be done" not in done.stdout and "pip install" not in done.stdout
    out = clone / "gpu-check"
    result = json.loads((out / "gpu-check.json").read_text())
    assert result["ok"] and result["environment"]["gpu"] is False
    tests = result["tests"]
    assert tests["skipped"] >= 6 and tests["passed"] == tests["failed"] == 0
    (run,) = result["workflows"].values()  # ESM-2's; ESM C's whole run is the GPU plan's
    assert run["ok"] and run["shards"] >= 1 and run["devices"] == ["cpu"]
    assert run["command"].startswith("snakemake ") and "gpus=auto" in run["command"]
    assert 0 < run["host_fraction"] < 1
    assert (
        0 < run["whole_shard_tokens_per_s_with_loading"] < run["whole_shard_tokens_per_s_loaded"]
    )
    assert run["compile_cache"] == ["off"] and run["compile_seconds"] == 0  # auto: off on CPUs
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
    }
    assert all(r["tokens_per_s"] > 0 and 0 < r["share_of_peak"] < 1 for r in peers.values())
    assert peers["esm2_t6_8M_UR50D", "fair-esm", "fp32"]["speedup_vs_baseline"] == 1
    compiled = peers["esm2_t6_8M_UR50D", "esmshard packed compiled", "bf16"]
    assert compiled["compiled_graphs"] >= 1 and compiled["compile_seconds"] > 0
    page = (out / "gpu-check.md").read_text()
    assert "**No GPU was found**" in page and "Verdict: **pass**" in page
    assert "## Peers side by side" in page and "transformers EsmcModel (SDPA)" in page
