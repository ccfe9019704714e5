"""NVML telemetry, memory-aware batches and the status view."""

import json
import os
import sys

import pytest
from helpers import MODEL, PROTEINS, REPO, snakemake

from esmshard.compute import telemetry

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
    assert (
        first["temperature_c"] is None
        and first["utilization_percent"] == 80
        and first["power_w"] == 303
    )
    assert (tmp_path / "t.tsv").read_text().count("\n") == len(sampler.samples) + 1
    summary = sampler.summary()
    assert summary["mean_utilization_percent"] == 80 and summary["memory_total_bytes"] == 40 << 30


def test_uuid_entries_map_to_their_device(tmp_path, fake_nvml):
    with telemetry.Sampler("GPU-fake-1", tmp_path / "t.tsv") as sampler:
        pass
    assert (
        sampler.name == "NVIDIA H100 80GB HBM3"
        and sampler.summary()["memory_total_bytes"] == 80 << 30
    )


def test_without_nvml_there_is_no_telemetry(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails as if nvidia-ml-py were absent
    assert telemetry.nvml_device_count() == 0
    with telemetry.Sampler("0", tmp_path / "t.tsv") as sampler:
        pass
    assert sampler.summary()["telemetry_samples"] == 0
    assert (tmp_path / "t.tsv").read_text() == "\t".join(telemetry.FIELDS) + "\n"  # header only


def test_four_stand_in_gpus_with_a_cpu_only_torch(tmp_path):
    env = {
        "PYTHONPATH": os.pathsep.join([str(FAKE_NVML), os.environ.get("PYTHONPATH", "")]),
        "CUDA_VISIBLE_DEVICES": None,
    }
    config = {"input": str(PROTEINS), "model": MODEL, "shards": 4, "gpus": "auto"}
    result = snakemake(tmp_path, config, "--resources", "gpu=4", env=env)
    outdir = tmp_path / "results"
    logs = [p.read_text() for p in sorted((outdir / "logs" / "embed").glob("*.log"))]
    assert all(
        "this torch cannot use CUDA" in log and "computing on the CPU" in log for log in logs
    )
    metrics = [json.loads(p.read_text()) for p in sorted((outdir / "metrics").glob("*.json"))]
    assert sorted(m["cuda_visible_devices"] for m in metrics) == ["0", "1", "2", "3"]
    assert all(m["device"] == "cpu" and m["telemetry_samples"] >= 1 for m in metrics)
    scaling = json.loads((outdir / "report" / "scaling.json").read_text())
    assert scaling["telemetry"] is True and len(scaling["devices"]) == 4
    by_total = sorted(scaling["devices"], key=lambda d: d["memory_total_bytes"])
    assert (
        by_total[0]["name"] == "NVIDIA A100-SXM4-40GB"
        and by_total[0]["mean_utilization_percent"] == 80
    )
    assert [d["name"] for d in by_total[1:]] == ["NVIDIA H100 80GB HBM3"] * 3
    assert all(
        d["peak_memory_used_bytes"] >= d["mean_memory_used_bytes"] > 0 for d in scaling["devices"]
    )
    html = (outdir / "report" / "scaling_report.html").read_text()
    assert html.count("data:image/png;base64,") == 4 and "NVIDIA A100-SXM4-40GB" in html
    assert len(list((outdir / "telemetry").glob("*.tsv"))) == 4
    assert result.stderr.count(" done on cpu") == 4
