import json

import pytest

from esmshard.steps.report import replay, write_report


def metrics(shard, slot, start, seconds, residues=1000):
    return {
        "shard": shard, "gpu_slot": slot, "device": "cpu", "device_name": "cpu", "host": "node1",
        "cuda_visible_devices": str(slot), "started_at": start, "finished_at": start + seconds,
        "seconds": seconds, "load_seconds": 1.0, "compute_seconds": seconds - 1, "n_sequences": 10, "n_residues": residues,
        "n_failed": 0, "model": "random:esm2_t6_8M_UR50D", "weights": "random", "telemetry_samples": 0,
    }  # fmt: skip


def test_replay_models_devices_taking_the_next_shard():
    assert replay([4, 4, 4, 4], 1) == 16
    assert replay([4, 4, 4, 4], 2) == 8
    assert replay([10, 1, 1, 1], 2) == 10


def test_report_from_metrics_and_header_only_telemetry(tmp_path):
    runs = [
        metrics("shard_0000", 0, 100.0, 10.0),
        metrics("shard_0001", 1, 100.0, 10.0),
        metrics("shard_0002", 0, 110.0, 5.0)
        | {"compile_seconds": 0.5, "compile_cache": "hit"},  # the others: metrics of no `compile`
    ]
    metric_files, telemetry_files = [], []
    for m in runs:
        (tmp_path / f"{m['shard']}.json").write_text(json.dumps(m))
        (tmp_path / f"{m['shard']}.tsv").write_text(
            "time\tutilization_percent\tmemory_used_bytes\n"
        )
        metric_files.append(tmp_path / f"{m['shard']}.json")
        telemetry_files.append(tmp_path / f"{m['shard']}.tsv")
    result = write_report(
        metric_files, telemetry_files, tmp_path / "scaling.json", tmp_path / "report.html"
    )
    assert json.loads((tmp_path / "scaling.json").read_text()) == json.loads(json.dumps(result))
    assert (
        result["n_shards"] == 3
        and result["wall_seconds"] == 15.0
        and result["busy_seconds"] == 25.0
    )
    assert result["measured"]["gpus"] == 2 and result["measured"]["speedup"] == pytest.approx(
        25 / 15
    )
    assert result["load_imbalance"] == pytest.approx(10 / (25 / 3))
    assert result["telemetry"] is False
    assert result["compile_seconds"] == 0.5 and result["compile_cache_hits"] == 1
    # per slot: busy time, and the wait after its last shard for the run's last one
    busy = {d["slot"]: (d["busy_seconds"], d["idle_tail_seconds"]) for d in result["devices"]}
    assert busy == {"node1:0": (15.0, 0.0), "node1:1": (10.0, 5.0)}
    assert result["idle_tail_seconds"] == 5.0
    # a measured speedup only for the slot count this run had; the rest modelled
    measured = {m["gpus"]: m["measured_speedup"] for m in result["modelled"]}
    assert measured == {1: None, 2: pytest.approx(25 / 15), 4: None, 8: None}
    assert [s["compile_cache"] for s in result["shards"]] == ["off", "off", "hit"]
    html = (tmp_path / "report.html").read_text()
    assert (
        "No GPU telemetry" in html
        and "Random-weight model" in html
        and html.count("data:image/png") == 3
        and "compile_seconds" in html
        and "shards whose compiled code was in the store" in html
        and "idle_tail_seconds" in html
        and "modelled_speedup" in html
        and "measured_speedup" in html
    )


def test_a_run_that_computed_nothing_says_so(tmp_path):
    result = write_report([], [], tmp_path / "scaling.json", tmp_path / "report.html")
    assert result["n_shards"] == 0
    assert json.loads((tmp_path / "scaling.json").read_text()) == result
    assert "computed nothing" in (tmp_path / "report.html").read_text()
