import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from esmshard.commands import status
from esmshard.layout import Layout
from esmshard.steps import run_state
from esmshard.steps.progress import Progress, shards_done
from esmshard.store import Store


@pytest.fixture
def run_in_progress(tmp_path):
    layout = Layout(str(tmp_path))
    (tmp_path / "shards").mkdir()
    (tmp_path / "shards" / "plan.tsv").write_text(
        "shard\tn_sequences\tn_residues\testimated_cost\nshard_0000\t5\t1000\t1000\n"
        "shard_0001\t5\t3000\t3000\n"
    )
    store = Store(str(tmp_path / "store"))
    (tmp_path / "shards" / "plan.json").write_text(json.dumps({"store": store.root, "key": "k1"}))
    Path(store.folder("k1")).mkdir(parents=True)
    Path(store.part("k1", "shard_0000")).write_bytes(b"")  # status looks for the part alone
    common = {"host": "node7", "device": "cuda:0", "device_name": "NVIDIA H100 80GB HBM3"}
    (tmp_path / "metrics").mkdir()
    (tmp_path / "metrics" / "shard_0000.json").write_text(json.dumps({
        **common, "shard": "shard_0000", "gpu_slot": 0, "cuda_visible_devices": "", "n_residues": 1000,
        "n_failed": 1, "started_at": 100.0, "finished_at": 110.0, "compute_seconds": 8.0,
        "peak_memory_used_bytes": 5 << 30, "memory_total_bytes": 80 << 30,
    }))  # fmt: skip
    Progress(layout.progress("shard_0000"), shard="shard_0000").update(0)  # finished: not running
    progress = Progress(
        layout.progress("shard_0001"), **common, shard="shard_0001", gpu_slot=1, started_at=105.0,
        n_residues=3000, cuda_visible_devices="1", gpu_bus_id="00000000:43:00.0",
    )  # fmt: skip
    progress.update(1000)
    progress.fields.update(memory_used_bytes=12 << 30, memory_total_bytes=80 << 30)
    progress.update(0)
    return tmp_path


def test_the_eta_is_in_cost_units_a_long_proteins_residues_costing_more(run_in_progress):
    """A job computes its longest proteins first: a third of its residues may be three quarters
    of its shard's cost (what its progress counts), and the rest goes faster per residue."""
    layout = Layout(str(run_in_progress))
    progress = json.loads(Path(layout.progress("shard_0001")).read_text())
    progress.update(cost=3000.0, kept_cost=0.0, cost_done=2250.0, computing_since=102.0)
    Path(layout.progress("shard_0001")).write_text(json.dumps(progress))
    state = run_state.read_state(run_in_progress, now=120.0)
    # 1000 (shard_0000) + 2250 computed in 18 s; 750 left of 4000
    assert state["eta_seconds"] == pytest.approx(750 / (3250 / 18))
    assert state["residues_per_second"] == 2000 / 18  # the rate shown stays in residues
    # the job's first batch, which paid its start-up, left out of the ETA's rate: 1000 + 2000
    # over the shard's 8 s and 104 s to 120 s (the two side by side once: 18 s)
    progress.update(warm_at=104.0, warm_cost=250.0)
    Path(layout.progress("shard_0001")).write_text(json.dumps(progress))
    state = run_state.read_state(run_in_progress, now=120.0)
    assert state["eta_seconds"] == pytest.approx(750 / (3000 / 18))


def test_status_of_a_run_in_progress(run_in_progress):
    state = run_state.read_state(run_in_progress, now=120.0)
    # 2,000 residues computed while a job computed: 102 s (shard_0000 loaded) to 120 s (now)
    assert state["residues_done"] == 2000 and state["residues_per_second"] == 2000 / 18
    assert state["eta_seconds"] == pytest.approx(18.0) and [
        r["shard"] for r in state["running"]
    ] == ["shard_0001"]
    text = status.render(state)
    assert (
        "node7:00000000:43:00.0" in text and "shard_0001 (33%)" in text and "12.0/80.0 GiB" in text
    )
    assert "node7:cpu0" in text and "idle" in text and "125" in text  # 1000 residues in 8 s
    # a slot whose job still runs has its rate too, counted as the run's: 1000 residues from
    # the job's start (105 s) to its last update (120 s); the run's 2000 in 18 s is both slots'
    assert state["slot_rates"] == {"node7:cpu0": 125.0, "node7:00000000:43:00.0": 1000 / 15}
    (running,) = [line for line in text.splitlines() if "shard_0001 (33%)" in line]
    assert running.split()[-3] == status.rate(1000 / 15) == "67", running
    assert "shards 1/2 (50%)" in text and "ETA 0m18s" in text and "1 failed" in text
    assert "no shard yet" not in text  # a plan of no pool (`shards` a number): its slots alone


def test_every_slot_of_the_pool_shows_those_that_ran_nothing_too(run_in_progress):
    plan = run_in_progress / "shards" / "plan.json"
    plan.write_text(json.dumps({**json.loads(plan.read_text()), "slots": 4}))
    text = status.render(run_state.read_state(run_in_progress, now=120.0))
    assert "node7:cpu0" in text and "node7:00000000:43:00.0" in text
    assert [line.split()[:2] for line in text.splitlines() if "no shard yet" in line] == [
        ["slot", "2"],
        ["slot", "3"],
    ]


def test_a_shard_whose_part_is_not_in_the_store_is_not_finished(run_in_progress):
    """A job killed after writing its metrics, before renaming its part into place."""
    state = run_state.read_state(run_in_progress, now=120.0)
    store = Store(str(run_in_progress / "store"))
    os.unlink(store.part("k1", "shard_0000"))
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    metrics = json.loads((run_in_progress / "metrics" / "shard_0000.json").read_text())
    fields = {k: metrics[k] for k in ("device", "device_name", "gpu_slot", "cuda_visible_devices",
                                      "n_residues", "started_at")}  # fmt: skip
    Progress(
        Layout(str(run_in_progress)).progress("shard_0000"), **fields, shard="shard_0000",
        host=socket.gethostname(), pid=int(gone.stdout),
    ).update(1000)  # fmt: skip
    killed = run_state.read_state(run_in_progress, now=120.0)
    assert (state["shards_done"], killed["shards_done"]) == (1, 0)
    text = status.render(killed)
    assert "shards 0/2 (0%)" in text and f"process {int(gone.stdout)} is gone" in text


def test_console_script_prints_the_same(run_in_progress):
    out = subprocess.run(
        [Path(sys.executable).parent / "esmshard", "status", str(run_in_progress)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "shard_0001" in out.stdout and "shards 1/2 (50%)" in out.stdout


@pytest.mark.parametrize("mark", ["logs/shard.log", ".esmshard/checksums.json"])
def test_before_sharding(tmp_path, mark):
    (tmp_path / mark).parent.mkdir()
    (tmp_path / mark).write_text("")
    assert "not sharded yet" in status.render(run_state.read_state(tmp_path))


def esmshard_status(*args):
    return subprocess.run(
        [Path(sys.executable).parent / "esmshard", "status", *map(str, args)],
        capture_output=True,
        text=True,
    )


def test_console_script_names_what_is_not_a_run(tmp_path):
    missing = esmshard_status(tmp_path / "nowhere")
    assert missing.returncode == 2 and "nowhere does not exist" in missing.stderr
    (tmp_path / "file").write_text("")
    a_file = esmshard_status(tmp_path / "file")
    assert a_file.returncode == 2 and "file is a file" in a_file.stderr
    (tmp_path / "empty").mkdir()
    empty = esmshard_status(tmp_path / "empty")
    assert empty.returncode == 1 and "no esmshard run here" in empty.stdout
    for bad in ("-1", "0"):
        watch = esmshard_status(tmp_path / "empty", "--watch", bad)
        assert watch.returncode == 2 and "greater than 0" in watch.stderr
        assert "Traceback" not in watch.stderr


class InterruptedImport:
    """A Ctrl-C that comes while `name` is imported (sys.meta_path asks its finders first)."""

    def __init__(self, name: str):
        self.name = name

    def find_spec(self, name, path=None, target=None):
        if name == self.name:
            raise KeyboardInterrupt


def test_ctrl_c_while_the_console_script_imports_ends_it_quietly(monkeypatch, capsys):
    from esmshard.commands import entry

    monkeypatch.delitem(sys.modules, "esmshard.commands.cli", raising=False)
    monkeypatch.setattr(
        sys, "meta_path", [InterruptedImport("esmshard.commands.cli"), *sys.meta_path]
    )
    with pytest.raises(SystemExit) as stopped:
        entry.main()
    assert stopped.value.code == 130 and capsys.readouterr() == ("", "")


def test_ctrl_c_while_the_watch_reads_the_run_ends_the_watch(run_in_progress, monkeypatch):
    from esmshard.commands import cli

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "read_state", interrupted)
    assert cli.main(["status", str(run_in_progress), "--watch", "1"]) == 0


def test_a_plan_without_shards(tmp_path):
    (tmp_path / "shards").mkdir()
    (tmp_path / "shards" / "plan.tsv").write_text(
        "shard\tn_sequences\tn_residues\testimated_cost\n"
    )
    (tmp_path / "shards" / "plan.json").write_text(json.dumps({"store": "", "key": ""}))
    text = status.render(run_state.read_state(tmp_path))
    assert "shards 0/0 (100%)" in text and "finished" in text


def test_files_of_an_earlier_sharding_count_for_nothing(run_in_progress):
    plan = run_in_progress / "shards" / "plan.tsv"
    stale = {"host": "node7", "device": "cuda:0", "device_name": "x", "gpu_slot": 0,
             "cuda_visible_devices": "", "n_residues": 9000, "n_failed": 0, "started_at": 1.0,
             "finished_at": 2.0, "compute_seconds": 1.0}  # fmt: skip
    for name in ("shard_0001", "shard_0005"):  # in the plan and not, both older than it
        (run_in_progress / "metrics" / f"{name}.json").write_text(
            json.dumps({**stale, "shard": name})
        )
    os.utime(plan, (plan.stat().st_mtime + 10,) * 2)  # the plan is rewritten after them
    for path in (run_in_progress / "progress").iterdir():
        os.utime(path, (plan.stat().st_mtime,) * 2)
    metrics = run_in_progress / "metrics" / "shard_0000.json"
    os.utime(metrics, (plan.stat().st_mtime,) * 2)
    state = run_state.read_state(run_in_progress, now=120.0)
    assert (state["shards_done"], state["shards_total"]) == (1, 2)
    assert state["residues_done"] == 2000 and state["eta_seconds"] == pytest.approx(18.0)
    assert shards_done(Layout(str(run_in_progress)), json.loads(metrics.read_text())) == (1, 2)


def test_a_job_that_died_shows_stale(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout  # fmt: skip
    here = {
        "host": socket.gethostname(),
        "pid": int(dead),
        "started_at": 100.0,
        "updated_at": 110.0,
    }
    assert run_state.stale_reason(here, now=111.0) == f"process {int(dead)} is gone"
    assert run_state.stale_reason({**here, "pid": os.getpid()}, now=111.0) is None
    elsewhere = {**here, "host": "another-node"}
    assert run_state.stale_reason(elsewhere, now=111.0) is None
    assert run_state.stale_reason(elsewhere, now=110.0 + 31 * 60) == "no update for 31m00s"


def test_the_neighbours_line_counts_the_parts_of_the_latest_cut(tmp_path):
    """Parts named "i-of-n": those of the largest n are the planned ones (a run that cut the
    reference anew leaves the old cut's), and a file of another name there is not a part."""
    layout = Layout(str(tmp_path))
    Path(layout.neighbours_dir).mkdir()
    for name in ("0-of-2", "0-of-3", "2-of-3", "notes"):
        Path(layout.neighbour_part(name)).write_bytes(b"")
    found = run_state.neighbour_jobs(layout, 0.0)
    assert found == {"done": 2, "planned": 3, "running": [], "written": False}
    assert status.later_steps({"neighbours": found}) == ["neighbours: 2 of 3 search jobs done"]
