"""Every file esmshard reads, damaged every way, fed to every command that reads it: each case
ends in one line naming the file (or the command goes on), never a traceback.

The forms: cut short, empty, valid JSON of another shape, a folder in its place, another
program's file. The run is made once; each case damages a copy of it. The table runs each
command through the console script's `main` in this process (what it prints, its exit status,
and any exception as the traceback a user would see), a sample of it as the `esmshard` command.
"""

import json
import re
import shutil
import subprocess
import sys
import traceback
from pathlib import Path

import h5py
import pytest
from helpers import MODEL, PROTEINS, snakemake

import esmshard
from esmshard.commands import cli
from esmshard.models import ModelError

ESMSHARD = Path(sys.executable).parent / "esmshard"
PNG = b"\x89PNG\r\n\x1a\n" + bytes(200)  # another program's binary file


def cut(path: Path, original: bytes) -> None:
    path.write_bytes(original[: len(original) // 2])


def empty(path: Path, original: bytes) -> None:
    path.write_bytes(b"")


def json_of_another_shape(path: Path, original: bytes) -> None:
    """`[]`; where the file is a JSON object, the same keys with null values."""
    try:
        found = json.loads(original)
    except ValueError:
        found = None
    path.write_text(json.dumps({k: None for k in found} if isinstance(found, dict) else []))


def folder(path: Path, original: bytes) -> None:
    path.mkdir()
    (path / "notes.txt").write_text("a folder where a file was\n")


def another_programs_file(path: Path, original: bytes) -> None:
    """An HDF5 file of another program where esmshard wrote one; else a PNG image."""
    if original.startswith(b"\x89HDF"):
        with h5py.File(path, "w") as h5:
            h5["data"] = [1, 2, 3]
    else:
        path.write_bytes(PNG)


FORMS = [cut, empty, json_of_another_shape, folder, another_programs_file]

# The commands, as users type them in the folder that holds the run's outdir `results`.
STATUS = ["status", "results"]
LIST = ["store", "results"]
VERIFY = ["store", "results", "--verify"]
PRUNE = ["store", "results/store", "--prune", "--keep", "results", "--apply"]
EXPORT = ["export", "results", "--format", "parquet", "--out", "proteins.parquet"]
EXPORT_H5 = ["export", "results", "--format", "per-protein-h5", "--out", "proteins.h5"]
EXPORT_NPY = ["export", "results", "--format", "npy", "--out", "npy"]

GOES_ON, REFUSED, FOUND = "goes on", "refused", "found"


def store_file(name: str):
    """A file of the run's settings folder in its store (`name` of its one part: part.h5)."""

    def find(outdir: Path) -> Path:
        (key,) = [p for p in (outdir / "store").iterdir() if re.fullmatch("[0-9a-f]{16}", p.name)]
        if name.startswith("part"):
            (part,) = key.glob("*.h5")
            return part.with_suffix(name[len("part") :])
        return key / name

    find.__name__ = f"store/<key>/{name}"
    return find


# (the file under the outdir, the command, how it ends whatever the damage): GOES_ON is exit
# status 0; REFUSED is status 1 with one line that names the file; FOUND (--verify's report)
# is status 1 with a line that names the damaged part, and the count.
CASES = [
    ("run.json", LIST, GOES_ON),  # the outdir's store/ is listed instead
    ("run.json", VERIFY, GOES_ON),
    ("shards/plan.json", STATUS, REFUSED),
    ("shards/plan.json", PRUNE, REFUSED),
    ("shards/plan.tsv", STATUS, REFUSED),
    ("shards/records.parquet", EXPORT_H5, REFUSED),
    ("shards/records.parquet", PRUNE, REFUSED),
    ("metrics/*.json", STATUS, GOES_ON),  # the shard is done: its part is in the store
    ("embeddings.h5", EXPORT, REFUSED),
    ("embeddings.h5", EXPORT_H5, REFUSED),
    ("embeddings.h5", STATUS, GOES_ON),
    (store_file("part.json"), LIST, GOES_ON),
    (store_file("part.json"), VERIFY, FOUND),  # set aside, the next run recomputes it
    (store_file("part.h5"), VERIFY, FOUND),
    (store_file("part.h5"), LIST, GOES_ON),
    (store_file("settings.json"), VERIFY, GOES_ON),
    (".esmshard/checksums.json", VERIFY, GOES_ON),
]
# A damaged failed_sequences.tsv of text may still read (a cut header names no failure); as
# binary, a folder: refused by name.
TEXT_OR_NOT = [("failed_sequences.tsv", EXPORT_NPY)]


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    workdir = tmp_path_factory.mktemp("finished")
    snakemake(workdir, {"input": str(PROTEINS), "model": MODEL, "shards": 1})
    return workdir


def copy_of(finished: Path, tmp_path: Path) -> Path:
    """A copy of the finished run's outdir in `tmp_path`."""
    outdir = tmp_path / "results"
    shutil.copytree(finished / "results", outdir)
    for named in ("run.json", "shards/plan.json"):  # they name the store by its absolute path
        path = outdir / named
        path.write_text(path.read_text().replace(str(finished), str(tmp_path)))
    return outdir


def damaged_copy(finished: Path, tmp_path: Path, file, form) -> tuple[Path, Path]:
    """A copy of the finished run, with `file` damaged in `form`; (file, outdir)."""
    outdir = copy_of(finished, tmp_path)
    if callable(file):
        path = file(outdir)
    else:
        (path,) = outdir.glob(file)
    original = path.read_bytes()
    path.unlink()
    form(path, original)
    return path, outdir


def esmshard_says(tmp_path: Path, command: list[str]):
    """`esmshard COMMAND` in `tmp_path`: its exit status and what it prints."""
    done = subprocess.run([ESMSHARD, *command], cwd=tmp_path, capture_output=True, text=True)
    return done.returncode, (done.stdout + done.stderr).strip()


def main_says(command: list[str], capfd):
    """The same through the console script's `main`, in this process (the current folder)."""
    try:
        status = cli.main(command)
    except SystemExit as exit:
        status = exit.code
    except Exception:
        status = "raised"
        traceback.print_exc()
    said = capfd.readouterr()
    return status or 0, (said.out + said.err).strip()


def no_stack_lines(said: str) -> bool:
    return "Traceback" not in said and not re.search(r'File ".*", line \d+', said)


def case_id(case) -> str:
    file, command, _ = case
    return f"{getattr(file, '__name__', file)}-{command[0]}-{command[-1].lstrip('-')}"


@pytest.mark.parametrize("form", FORMS, ids=lambda form: form.__name__)
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_a_damaged_file_ends_in_one_line_naming_it_or_the_command_goes_on(
    tmp_path, finished, case, form, capfd, monkeypatch
):
    file, command, ends = case
    path, _ = damaged_copy(finished, tmp_path, file, form)
    monkeypatch.chdir(tmp_path)
    status, said = main_says(command, capfd)
    assert no_stack_lines(said), said
    if ends == GOES_ON:
        assert status == 0, said
    elif ends == REFUSED:
        assert status == 1 and len(said.splitlines()) == 1, said
        assert path.name in said or path.parent.name in said, said
    else:
        assert status == 1 and f"damaged: {path.with_suffix('.h5')}: " in said, said
        assert said.splitlines()[-1].endswith("1 parts checked, 1 damaged"), said


@pytest.mark.parametrize(
    "file, command", [("embeddings.h5", EXPORT), ("shards/plan.json", STATUS)]
)
def test_as_the_esmshard_command_too(tmp_path, finished, file, command):
    path, _ = damaged_copy(finished, tmp_path, file, cut)
    status, said = esmshard_says(tmp_path, command)
    assert status == 1 and no_stack_lines(said) and len(said.splitlines()) == 1, said
    assert path.name in said, said


@pytest.mark.parametrize("form", FORMS, ids=lambda form: form.__name__)
@pytest.mark.parametrize("case", TEXT_OR_NOT, ids=lambda case: case[0])
def test_a_damaged_failure_list_reads_or_is_refused_by_name(
    tmp_path, finished, case, form, capfd, monkeypatch
):
    file, command = case
    path, _ = damaged_copy(finished, tmp_path, file, form)
    monkeypatch.chdir(tmp_path)
    status, said = main_says(command, capfd)
    assert no_stack_lines(said), said
    assert status == 0 or (len(said.splitlines()) == 1 and path.name in said), said


def test_metrics_unreadable_are_said_and_the_run_counts_as_finished(tmp_path, finished):
    _, outdir = damaged_copy(finished, tmp_path, "metrics/*.json", cut)
    status, said = esmshard_says(tmp_path, STATUS)
    assert status == 0 and "shards 1/1 (100%)" in said and "finished" in said, said
    assert "metrics/*.json of 1 finished shard missing or unreadable" in said


def test_a_settings_folder_with_a_damaged_settings_json_is_listed_and_left_alone(
    tmp_path, finished
):
    path, outdir = damaged_copy(finished, tmp_path, store_file("settings.json"), cut)
    status, said = esmshard_says(tmp_path, LIST)
    assert status == 1 and no_stack_lines(said), said
    assert f"{path.parent.name}: not esmshard's, left alone (its settings.json is not" in said
    assert list(path.parent.glob("*.h5")), "nothing of the folder was removed"


def test_a_file_where_the_store_keeps_its_locks_is_named_before_anything_changes(
    tmp_path, finished
):
    outdir = copy_of(finished, tmp_path)
    shutil.rmtree(outdir / "store" / ".locks")
    (outdir / "store" / ".locks").write_text("a user's notes\n")
    key = next(p.name for p in (outdir / "store").iterdir() if not p.name.startswith("."))
    expected = "store/.locks is a file, where esmshard keeps the store's lock files: move it away"
    status, said = esmshard_says(tmp_path, ["store", "results", "--remove", key])
    assert status == 1 and len(said.splitlines()) == 1 and expected in said, said
    with pytest.raises(ValueError, match=re.escape(expected)):
        esmshard.embed(["MKV"], MODEL, store=str(outdir / "store"))
    done = subprocess.run([ESMSHARD, "run", str(PROTEINS), "-o", "again", "--model", MODEL,
                           "--config", "store=results/store"], cwd=tmp_path, capture_output=True,
                          text=True)  # fmt: skip
    assert done.returncode == 2 and no_stack_lines(done.stderr), done.stderr
    assert done.stderr.splitlines()[1:] == [f"esmshard: store: results/{expected} (esmshard "
                                            "made no such file)"]  # fmt: skip
    assert (outdir / "store" / ".locks").read_text() == "a user's notes\n"


@pytest.mark.parametrize("form", FORMS, ids=lambda form: form.__name__)
def test_a_damaged_checkpoint_is_named_in_one_line(tmp_path, form):
    path = tmp_path / "esm2_t6_8M_UR50D.pt"
    form(path, Path(MODEL).read_bytes())
    with pytest.raises(ModelError) as refused:
        esmshard.embed(["MKV"], str(path))
    message = str(refused.value)
    assert str(path) in message and "\n" not in message
    assert "arbitrary code" not in message  # not a pickle of foreign objects: a damaged file


def test_a_cut_checkpoint_stops_esmshard_run_before_any_job_in_one_line(tmp_path):
    path = tmp_path / "esm2_t6_8M_UR50D.pt"
    cut(path, Path(MODEL).read_bytes())
    done = subprocess.run([ESMSHARD, "run", str(PROTEINS), "-o", "out", "--model", str(path)],
                          cwd=tmp_path, capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 2 and no_stack_lines(done.stderr), done.stderr
    assert done.stderr.splitlines()[1:] == [
        f"esmshard: '{path}' is cut short (an interrupted download or copy?): download the "
        "checkpoint again"
    ]
    assert not (tmp_path / "out").exists()


def test_a_folder_set_aside_is_listed_with_its_size_and_pruned(tmp_path, finished):
    path, outdir = damaged_copy(finished, tmp_path, store_file("part.h5"), folder)
    (path / "big.bin").write_bytes(bytes(50_000))
    assert esmshard_says(tmp_path, VERIFY)[0] == 1
    aside = path.with_name(path.name + ".corrupt")
    assert aside.is_dir()
    (path.parent / "notes.corrupt").mkdir()  # not a name esmshard sets aside: never pruned
    listed = esmshard_says(tmp_path, PRUNE[:-1])[1]  # without --apply
    (line,) = [line for line in listed.splitlines() if line.endswith(".h5.corrupt")]
    assert line.split()[:2] == ["50.0", "KB"], listed  # its files' bytes, not the folder's entry
    status, said = esmshard_says(tmp_path, PRUNE)
    assert status == 0 and no_stack_lines(said) and not aside.exists(), said
    assert (path.parent / "notes.corrupt").is_dir()
    assert esmshard_says(tmp_path, PRUNE)[1].startswith("removed 0 files")


@pytest.mark.parametrize("form", FORMS, ids=lambda form: form.__name__)
def test_a_running_shards_damaged_progress_is_left_out_of_status(tmp_path, finished, form):
    """A shard still running (its part not in the store yet) whose progress file is damaged:
    the job rewrites it after every batch, so status shows the shard as not started."""
    path, outdir = damaged_copy(finished, tmp_path, "progress/*.json", form)
    for part in (outdir / "store").glob("*/*.h5"):
        part.unlink()
    (outdir / "embeddings.h5").unlink()  # not merged yet
    status, said = esmshard_says(tmp_path, STATUS)
    assert status == 0 and no_stack_lines(said), said
    assert "shards 0/1 (0%)" in said, said


# What a refusal tells the user to do, as it says it: (the words, whether it says to remove the file).
ADVICE = [
    ("remove it and run the workflow again", True),
    ("the run's same command plans it anew", False),
]


@pytest.mark.parametrize(
    "file, command",
    [
        ("shards/plan.json", STATUS),
        ("shards/plan.tsv", STATUS),
        ("shards/records.parquet", EXPORT_H5),
        ("embeddings.h5", EXPORT),
    ],
)
def test_a_refusals_advice_followed_as_written_makes_the_command_work(
    tmp_path, finished, file, command
):
    path, _ = damaged_copy(finished, tmp_path, file, cut)
    status, said = esmshard_says(tmp_path, command)
    (remove,) = [remove for words, remove in ADVICE if words in said] or [None]
    assert status == 1 and remove is not None, said
    if remove:
        path.unlink()
    again = snakemake(tmp_path, {"input": str(PROTEINS), "model": MODEL, "shards": 1})
    assert "rule embed" not in again.stdout + again.stderr  # the store had every sequence
    status, said = esmshard_says(tmp_path, command)
    assert status == 0, said


RUN_CONFIG = {"input": str(PROTEINS), "model": MODEL, "shards": 1}  # the finished run's


def test_the_reports_advice_on_a_damaged_metrics_file_followed_as_written(tmp_path, finished):
    path, outdir = damaged_copy(finished, tmp_path, "metrics/*.json", cut)
    shutil.rmtree(outdir / "report")  # written again: it reads every shard's metrics
    failed = snakemake(tmp_path, RUN_CONFIG, check=False)
    said = failed.stdout + failed.stderr
    advice = "remove it and run the same command again (its shard is embedded again)"
    assert failed.returncode != 0 and f"{path.name} is not the metrics file" in said, said
    assert advice in said, said
    path.unlink()
    again = snakemake(tmp_path, RUN_CONFIG)
    assert "rule embed:" in again.stdout + again.stderr
    assert (outdir / "report" / "scaling_report.html").is_file()


def test_merges_advice_on_a_plan_of_other_settings_followed_as_written(tmp_path, finished):
    outdir = copy_of(finished, tmp_path)
    plan = outdir / "shards" / "plan.json"
    plan.write_text(json.dumps({**json.loads(plan.read_text()), "key": "0" * 16}))
    (outdir / "embeddings.h5").unlink()  # merged again, from this plan
    failed = snakemake(tmp_path, RUN_CONFIG, check=False)
    said = failed.stdout + failed.stderr
    advice = "planned with other embedding settings than this run's; delete results/shards and "
    assert failed.returncode != 0 and advice + "run the same command again" in said, said
    shutil.rmtree(outdir / "shards")
    snakemake(tmp_path, RUN_CONFIG)
    status, said = esmshard_says(tmp_path, EXPORT)
    assert status == 0, said
