"""The neighbours search jobs as `esmshard status` and the report see them: a running job's
rows done and time left, only this search's parts counted, what each part was asked."""

import fcntl
import json

import numpy as np
import pytest
from helpers import MODEL, SLICE

import esmshard
from esmshard.commands.status import later_steps
from esmshard.layout import Layout
from esmshard.steps import neighbours as steps
from esmshard.steps.run_state import neighbour_jobs


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    folder = tmp_path_factory.mktemp("search")
    records = dict((h[1:].split()[0], s) for h, s in SLICE[:30])
    esmshard.embed(records, MODEL, store=folder / "store").save(folder / "run")
    return folder / "run"


def test_a_part_says_its_rows_as_it_goes_and_leaves_only_its_search(saved, tmp_path, monkeypatch):
    layout = Layout(str(tmp_path))
    folder = tmp_path / "neighbours"
    folder.mkdir()
    for name in ("0-of-3.npz", "0-of-3.json", "2-of-3.npz", "2-of-3.progress.json"):
        (folder / name).write_text("an earlier search's")
    for name in ("notes-of-mine.txt", "0-of-3.txt"):  # a user's, named like a part
        (folder / name).write_text("mine")
    (folder / "1-of-2.npz").write_text("this search's other part")
    written = []
    monkeypatch.setattr(steps.PartProgress, "EVERY_SECONDS", 0)
    monkeypatch.setattr("esmshard.outputs.nearest.REFERENCE_ROWS_AT_ONCE", 4)
    real = steps.write_json

    def write_json(path, data):
        written.append(dict(data))
        real(path, data)

    monkeypatch.setattr(steps, "write_json", write_json)
    search = steps.Search(k=3, metric="cosine", layer=-1, reference="self")
    h5 = str(saved / "embeddings.h5")
    steps.search_part(h5, h5, layout.neighbour_part("0-of-2"), layout.neighbour_metrics("0-of-2"),
                      "0-of-2", search, run_lock=layout.run_lock)  # fmt: skip
    progress, metrics = written[:-1], written[-1]
    assert [p["done"] for p in progress] == [0, 4, 8, 12, 15] and {
        p["rows"] for p in progress
    } == {15}
    assert (metrics["k"], metrics["metric"], metrics["layer"], metrics["reference"]) == (
        3, "cosine", 6, "self")  # fmt: skip
    # the progress gone with the job, the other search's parts removed, the user's file kept
    assert sorted(p.name for p in folder.iterdir()) == [
        "0-of-2.json", "0-of-2.npz", "0-of-3.txt", "1-of-2.npz", "notes-of-mine.txt"]  # fmt: skip
    with np.load(folder / "0-of-2.npz") as hits:
        assert hits["rows"].shape == (30, 3) and (hits["rows"] < 15).all()


def test_status_shows_a_running_search_with_its_eta_while_the_run_is_on(tmp_path):
    layout = Layout(str(tmp_path))
    folder = tmp_path / "neighbours"
    folder.mkdir()
    (folder / "0-of-2.npz").write_bytes(b"")
    progress = {"part": "1-of-2", "rows": 1000, "done": 250, "started_at": 100.0}
    (folder / "1-of-2.progress.json").write_text(json.dumps(progress))
    assert neighbour_jobs(layout, 160.0)["running"] == []  # no command on: a killed job's
    (tmp_path / ".esmshard").mkdir()
    with open(layout.run_lock, "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        state = neighbour_jobs(layout, 160.0)
    assert state == {"done": 1, "planned": 2, "written": False, "running": [
        {"part": "1-of-2", "fraction": 0.25, "eta_seconds": 180.0}]}  # fmt: skip
    assert later_steps({"neighbours": state}) == [
        "neighbours: 1 of 2 search jobs done; 1-of-2 at 25%, ETA 3m00s"
    ]


def test_queries_that_are_not_numbers_are_said_once_by_the_first_part(saved, tmp_path, caplog):
    import h5py

    nan = tmp_path / "nan.h5"
    nan.write_bytes((saved / "embeddings.h5").read_bytes())
    with h5py.File(nan, "r+") as h5:
        (layer,) = [name for name in h5["mean"] if name.isdigit()]
        h5["mean"][layer][4] = np.nan
    layout = Layout(str(tmp_path))
    (tmp_path / "neighbours").mkdir()
    search = steps.Search(k=2, metric="euclidean", layer=-1, reference="ref")
    for part in ("0-of-2", "1-of-2"):
        steps.search_part(nan, saved / "embeddings.h5", layout.neighbour_part(part),
                          layout.neighbour_metrics(part), part, search)  # fmt: skip
    said = [r.getMessage() for r in caplog.records if "NaN" in r.getMessage()]
    assert said == [
        f"1 of the 30 queries' embeddings in {nan} hold NaN or infinite values (e.g. "
        f"{SLICE[4][0][1:].split()[0]}): they get no neighbours; embed them again with "
        "precision: fp32"
    ]
