"""A job's progress file and line: the ETA it says is the one `esmshard status` computes."""

import json

import pytest

from esmshard.steps.progress import Progress, duration, eta_seconds, since_warm


def test_the_eta_is_the_cost_left_at_the_rate_computed():
    assert eta_seconds(30.0, 10.0, 5.0) == 15.0
    assert eta_seconds(-2.0, 10.0, 5.0) == 0.0  # more done than planned: no time left
    assert eta_seconds(30.0, 0.0, 5.0) is None  # nothing computed yet: no rate
    assert eta_seconds(30.0, 10.0, 0.0) is None


def test_a_jobs_line_says_the_eta_of_its_work_since_its_first_batch(tmp_path, monkeypatch):
    progress = Progress(tmp_path / "shard_0000.json", shard="shard_0000", n_residues=4000)
    progress.computing(0, since=100.0, cost=4000.0)
    clock = iter([104.0, 110.0])
    monkeypatch.setattr("esmshard.steps.progress.time.time", lambda: next(clock))
    progress.update(1000, cost=500.0)  # the first batch: start-up paid at 104 s
    progress.update(1000, cost=1500.0)  # 1500 more cost units in 6 s
    fields = json.loads((tmp_path / "shard_0000.json").read_text())
    work, (start, end) = since_warm(fields, 110.0)
    assert (work, start, end) == (1500.0, 104.0, 110.0)
    line = progress.line(110.0)
    # 2000 of 4000 cost units left at 250 a second: 8 s (the residues' rate would say 12 s)
    assert line.endswith(f"ETA {duration(8.0)}")
    assert "2,000/4,000 residues (50%)" in line


@pytest.mark.parametrize("cost", [None, 0.0])
def test_a_job_without_a_planned_cost_says_it_cannot_tell(tmp_path, cost):
    progress = Progress(tmp_path / "p.json", shard="s", n_residues=10)
    progress.computing(0, since=1.0, cost=cost)
    progress.update(5)
    assert progress.line(5.0).endswith("ETA ?")
