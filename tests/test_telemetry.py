"""NVML telemetry, memory-aware batches and the status view."""
import json
import os
import sys

import pytest

from esmshard import embed, status, telemetry

from conftest import PROTEINS, REPO, TINY_MODEL, snakemake

FAKE_NVML = REPO / "tests" / "fake_nvml"


@pytest.fixture
def fake_nvml(monkeypatch):
    monkeypatch.syspath_prepend(str(FAKE_NVML))
    sys.modules.pop("pynvml", None)
    yield
    sys.modules.pop("pynvml", None)


def test_sampler_reads_the_device_and_tolerates_unsupported_queries(tmp_path, fake_nvml):
    with telemetry.Sampler("3", tmp_path / "t.tsv", interval=0.01) as sampler:
        while len(sampler.samples) < 3:
            pass
    assert sampler.name == "NVIDIA A100-SXM4-40GB"
    first = sampler.samples[0]
    assert first["temperature_c"] is None and first["utilization_percent"] == 80 and first["power_w"] == 303
    assert (tmp_path / "t.tsv").read_text().count("\n") == len(sampler.samples) + 1
    summary = sampler.summary()
    assert summary["mean_utilization_percent"] == 80 and summary["memory_total_bytes"] == 40 << 30


def test_uuid_entries_map_to_their_device(tmp_path, fake_nvml):
    with telemetry.Sampler("GPU-fake-1", tmp_path / "t.tsv") as sampler:
        pass
    assert sampler.name == "NVIDIA H100 80GB HBM3" and sampler.summary()["memory_total_bytes"] == 80 << 30


def test_without_nvml_there_is_no_telemetry(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails as if nvidia-ml-py were absent
    assert telemetry.nvml_device_count() == 0
    with telemetry.Sampler("0", tmp_path / "t.tsv") as sampler:
        pass
    assert sampler.summary()["telemetry_samples"] == 0 and not (tmp_path / "t.tsv").exists()


def test_auto_budget_grows_with_free_memory_and_caps_sequence_length():
    small = embed.auto_token_budget(8 << 30, 2_600_000_000, 1280, 20, 1024)
    large = embed.auto_token_budget(80 << 30, 2_600_000_000, 1280, 20, 1024)
    assert 1024 <= small < large
    # a longer batch needs more memory per token, but never beyond the model's maximum length
    assert embed.auto_token_budget(80 << 30, 0, 1280, 20, 200) > large
    assert embed.auto_token_budget(80 << 30, 2_600_000_000, 1280, 20, 30000) == large
    # never below one sequence of the batch's width, even without room
    assert embed.auto_token_budget(1 << 20, 2_600_000_000, 1280, 20, 900) == 900


def test_batches_follow_a_budget_that_depends_on_the_longest_sequence():
    lengths = [1000, 900, 300, 300, 300, 300, 100, 100]
    batches = embed.make_batches(lengths, lambda longest: 1100 if longest > 500 else 1300)
    assert batches == [[0], [1], [2, 3, 4, 5], [6, 7]]


def test_four_stand_in_gpus_with_a_cpu_only_torch(tmp_path):
    env = {"PYTHONPATH": os.pathsep.join([str(FAKE_NVML), os.environ.get("PYTHONPATH", "")]),
           "CUDA_VISIBLE_DEVICES": None}
    config = {"input": str(PROTEINS), "model": f"random:{TINY_MODEL}", "shards": 4, "gpus": "auto"}
    result = snakemake(tmp_path, config, "--resources", "gpu=4", env=env)
    outdir = tmp_path / "results"
    logs = [p.read_text() for p in sorted((outdir / "logs" / "embed").glob("*.log"))]
    assert all("this torch cannot use CUDA" in log and "computing on the CPU" in log for log in logs)
    metrics = [json.loads(p.read_text()) for p in sorted((outdir / "metrics").glob("*.json"))]
    assert sorted(m["cuda_visible_devices"] for m in metrics) == ["0", "1", "2", "3"]
    assert all(m["device"] == "cpu" and m["telemetry_samples"] >= 1 for m in metrics)
    scaling = json.loads((outdir / "report" / "scaling.json").read_text())
    assert scaling["telemetry"] is True and len(scaling["devices"]) == 4
    by_total = sorted(scaling["devices"], key=lambda d: d["memory_total_bytes"])
    assert by_total[0]["name"] == "NVIDIA A100-SXM4-40GB" and by_total[0]["mean_utilization_percent"] == 80
    assert [d["name"] for d in by_total[1:]] == ["NVIDIA H100 80GB HBM3"] * 3
    assert all(d["peak_memory_used_bytes"] >= d["mean_memory_used_bytes"] > 0 for d in scaling["devices"])
    html = (outdir / "report" / "scaling_report.html").read_text()
    assert html.count("data:image/png;base64,") == 4 and "NVIDIA A100-SXM4-40GB" in html
    assert len(list((outdir / "telemetry").glob("*.tsv"))) == 4
    assert result.stderr.count(" done on cpu") == 4


def test_status_of_a_run_in_progress(tmp_path):
    (tmp_path / "shards").mkdir()
    (tmp_path / "shards" / "plan.tsv").write_text(
        "shard\tn_sequences\tn_residues\testimated_cost\nshard_0000\t5\t1000\t1\nshard_0001\t5\t3000\t1\n")
    common = {"host": "node7", "device": "cuda:0", "device_name": "NVIDIA H100 80GB HBM3"}
    (tmp_path / "metrics").mkdir()
    (tmp_path / "metrics" / "shard_0000.json").write_text(json.dumps({
        **common, "shard": "shard_0000", "gpu_slot": 0, "cuda_visible_devices": "", "n_residues": 1000, "n_failed": 1, "started_at": 100.0,
        "finished_at": 110.0, "compute_seconds": 8.0, "peak_memory_used_bytes": 5 << 30,
        "memory_total_bytes": 80 << 30}))
    (tmp_path / "running").mkdir()
    (tmp_path / "running" / "shard_0001.json").write_text(json.dumps({
        **common, "shard": "shard_0001", "gpu_slot": 1, "started_at": 105.0, "n_residues": 3000,
        "residues_done": 1000, "memory_used_bytes": 12 << 30, "memory_total_bytes": 80 << 30,
        "cuda_visible_devices": "1", "gpu_bus_id": "00000000:43:00.0"}))
    state = status.read_state(tmp_path, now=120.0)
    assert state["residues_done"] == 2000 and state["residues_per_second"] == 100.0
    assert state["eta_seconds"] == 20.0
    text = status.render(state)
    assert "node7:00000000:43:00.0" in text and "shard_0001 (33%)" in text and "12.0/80.0 GiB" in text
    assert "node7:cpu0" in text and "idle" in text and "125" in text  # 1000 residues in 8 s
    assert "shards 1/2 (50%)" in text and "ETA 0m20s" in text and "1 failed" in text
