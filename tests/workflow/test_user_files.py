"""esmshard removes only what it wrote: a user's files planted in the outdir, the store and beside
the input stay byte-identical through a run, a resume after kill -9, `esmshard store` and an
export; an input where the run writes is refused before any work."""

import os
import random
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import (
    MODEL,
    NEW,
    A,
    config,
    config_check,
    fasta,
    kill_9_after_shards,
    read_only,
    run_json,
    snakemake,
    snakemake_command,
    the_one_refusal,
)

import esmshard
from esmshard.store import Store

ESMSHARD = Path(sys.executable).parent / "esmshard"
HOST = socket.gethostname()
# Names that esmshard's clean-up once took for its own: temporaries of a long-dead process
# (`.NAME.<digits>.tmp`, files and folders) and folders holding a settings.json.
HOSTILE = [
    "notes/.draft.12345.tmp",
    ".sync.777.tmp/state",
    f".mine.{HOST}.1.tmp",
    ".vscode/settings.json",
    ".vscode/launch.json",
    ".vscode/tasks.json",
    "analysis/settings.json",
    "analysis/summary.json",
    "README.txt",
    # A folder named like a settings key (a hash, a commit id) with a settings.json of its own.
    "cafebabedeadbeef/settings.json",
    "cafebabedeadbeef/notes.json",
]


def random_names(rng: random.Random, n: int) -> list[str]:
    """Random paths, a third of them named like temporaries and a third like settings folders."""
    names = []
    for i in range(n):
        folder = "/".join(f"d{rng.randrange(10**6)}" for _ in range(rng.randrange(3)))
        stem = f"u{rng.randrange(10**9)}"
        name = [f".{stem}.{rng.randrange(10**6)}.tmp", f"{stem}.json", f"{stem}.txt"][i % 3]
        names.append(f"{folder}/{name}".lstrip("/"))
        if i % 3 == 1:
            names.append(f"{folder}/settings.json".lstrip("/"))
        if i % 4 == 0:  # at the top: a folder named like a settings key, a settings.json in it
            hexname = f"{rng.getrandbits(64):016x}"
            names += [f"{hexname}/settings.json", f"{hexname}/{stem}.json"]
    return names


def plant(root: Path, names: list[str], rng: random.Random) -> dict[Path, bytes]:
    """The user's files under `root`, two hours old (older than any clean-up's grace)."""
    planted = {}
    then = time.time() - 2 * 3600
    for name in names:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(rng.randbytes(64))
        planted[path] = path.read_bytes()
    for path in planted:
        for p in [path, *path.parents]:
            if p == root:
                break
            os.utime(p, (then, then))
    return planted


def changed(planted: dict[Path, bytes]) -> list[str]:
    return [str(p) for p, data in planted.items() if not p.is_file() or p.read_bytes() != data]


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(ESMSHARD), *args], cwd=cwd, capture_output=True, text=True)


def test_users_files_survive_runs_resume_store_maintenance_and_exports(tmp_path):
    rng = random.Random(1)
    outdir, store_root = tmp_path / "out", tmp_path / "lab"  # the store: a folder of the user's
    (tmp_path / "in").mkdir()
    a = fasta(tmp_path / "in" / "a.fasta", A)
    b = fasta(tmp_path / "in" / "b.fasta", A + NEW)
    planted = {}
    for root in (outdir, store_root, a.parent):
        planted |= plant(root, HOSTILE + random_names(rng, 24), rng)
    more = ("shards=1", f"store={store_root}")
    snakemake(tmp_path, {}, "--resources", "gpu=1", *config(a, outdir, *more))
    assert changed(planted) == []
    # A grown input killed after its first new shard, then the same command.
    cmd, env = snakemake_command(
        tmp_path, {}, "--resources", "gpu=1", *config(b, outdir, "shards=3", more[1])
    )
    kill_9_after_shards(cmd, env, store_root, 2)
    snakemake(tmp_path, {}, "--resources", "gpu=1", *config(b, outdir, "shards=3", more[1]))
    assert changed(planted) == []

    (key,) = Store(str(store_root)).settings_keys()
    for args in (
        [str(store_root)],
        [str(store_root), "--verify"],
        [str(store_root), "--prune", "--keep", "out", "--apply"],
        ["out", "--verify"],
    ):
        done = cli("store", *args, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
    export = cli("export", "out", "--format", "pt", "--out", "pt", cwd=tmp_path)
    assert export.returncode == 0, export.stderr
    assert changed(planted) == []
    # esmshard.embed with the same store; the listing names the user's folders as theirs.
    five = {h[1:].split()[0]: s for h, s in A[:5]}
    reused = esmshard.embed(five, MODEL, store=store_root, shards=1)
    assert len(reused) == 5
    listing = cli("store", str(store_root), cwd=tmp_path).stdout
    assert "  cafebabedeadbeef: not esmshard's, left alone" in listing
    assert changed(planted) == []

    # Removing anything that is not one of the store's settings keys is refused in one line.
    for name in (".vscode", "analysis", "README.txt", "../out", "cafebabedeadbeef"):
        done = cli("store", str(store_root), "--remove", name, cwd=tmp_path)
        assert done.returncode == 1 and "Traceback" not in done.stderr
        assert done.stderr.startswith("esmshard store: ") and len(done.stderr.splitlines()) == 1
        assert f"holds no settings '{name}'" in done.stderr
    # A folder of the user's that no run wrote is no store: refused, nothing touched.
    for args in ([], ["--verify"], ["--prune", "--keep", "out", "--apply"], ["--remove", key]):
        done = cli("store", "in", *args, cwd=tmp_path)
        assert done.returncode == 1 and "is not an esmshard store" in done.stderr, done.stderr
        assert len(done.stderr.splitlines()) == 1
    assert cli("store", str(store_root), "--remove", key, cwd=tmp_path).returncode == 0
    assert changed(planted) == []
    assert not Path(store_root, key).exists()


@pytest.mark.parametrize(
    "where",
    ["out/embeddings.h5", "out/run.json", "out/shards/mine.fasta", "out/logs/x.fasta"],
)
def test_an_input_where_the_run_writes_is_refused_before_any_work(tmp_path, where):
    (tmp_path / where).parent.mkdir(parents=True)
    target = fasta(tmp_path / where, A[:5])
    before = target.read_bytes()
    line = the_one_refusal(config_check(tmp_path, {}, *config(where, "out")))
    assert f"input FASTA '{where}' is where this run writes" in line
    assert target.read_bytes() == before
    assert not (tmp_path / "out" / "shards" / "plan.tsv").exists()


def test_a_tilde_in_the_paths_typed_means_home_for_every_step(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    fasta(home / "a.fasta", A[:6])
    done = snakemake(
        tmp_path / "work", {}, "--config", "input=~/a.fasta", "outdir=~/out", "store=~/store",
        f"model={MODEL}", "shards=1", env={"HOME": str(home)},
    )  # fmt: skip
    assert done.returncode == 0
    assert (home / "out" / "embeddings.h5").is_file() and Store(str(home / "store")).is_store()
    assert not list(tmp_path.rglob("~"))


def test_paths_that_cannot_work_are_named_in_one_line_before_any_work(tmp_path):
    (tmp_path / "in").mkdir()
    fasta(tmp_path / "in" / "a.fasta", A[:4])
    os.mkfifo(tmp_path / "pipe.fasta")
    (tmp_path / "taken").write_text("a file of the user's\n")
    for config_items, message in (
        (config("in", "out"), "input FASTA 'in' is a folder; give the FASTA files in it"),
        (config("pipe.fasta", "out"), "input FASTA 'pipe.fasta' is a named pipe (FIFO)"),
        (config("in/a.fasta", "taken"), "outdir 'taken' is a file; choose a folder for `outdir`"),
    ):
        refused = config_check(tmp_path, {}, *config_items)
        assert message in the_one_refusal(refused), refused
        assert not (tmp_path / "out" / "shards" / "plan.tsv").exists()
    assert (tmp_path / "taken").read_text() == "a file of the user's\n"
    os.symlink("gone/elsewhere.pt", tmp_path / "dangling")
    for out, message in (
        ("missing/x.pt", "missing is not a folder; make it, or choose another --out"),
        (
            "dangling",
            "dangling is a link to gone/elsewhere.pt, which does not exist; remove the link or choose another --out",
        ),
    ):
        done = cli("export", "out", "--format", "pt", "--out", out, cwd=tmp_path)
        assert done.returncode == 1 and done.stderr.strip() == f"esmshard export: {message}"


def test_a_read_only_store_is_reused_and_one_that_must_grow_says_so(tmp_path):
    """A store shared read-only (a lab's, a snapshot) serves every run it holds the sequences
    of; a run that would add to it is refused in one line before any work, naming the key."""
    fasta(tmp_path / "a.fasta", A[:8])
    fasta(tmp_path / "b.fasta", A[:8] + NEW[:2])
    snakemake(tmp_path, {}, *config("a.fasta", "first", "shards=2", "store=lab"))
    plant(tmp_path / "lab", HOSTILE, random.Random(3))
    before = {p: p.read_bytes() for p in (tmp_path / "lab").rglob("*") if p.is_file()}
    with read_only(tmp_path / "lab"):
        snakemake(tmp_path, {}, *config("a.fasta", "second", "store=lab"))
        reused = run_json(tmp_path / "second")
        assert (reused["computed"], reused["from_store"], reused["failed"]) == (0, 8, 0)
        grown = snakemake(tmp_path, {}, *config("b.fasta", "third", "store=lab"), check=False)
        # `esmshard store` lists and verifies it; what would remove anything says why not.
        (key,) = Store(str(tmp_path / "lab")).settings_keys()
        assert cli("store", "lab", cwd=tmp_path).returncode == 0
        verified = cli("store", "lab", "--verify", cwd=tmp_path)
        assert verified.returncode == 0 and "2 parts checked, 0 damaged" in verified.stdout
        for args in (["--remove", key], ["--prune", "--keep", "first", "--apply"]):
            done = cli("store", "lab", *args, cwd=tmp_path)
            assert done.returncode == 1 and done.stderr == (
                f"esmshard store: {tmp_path}/lab cannot be written: Read-only file system "
                "(EROFS); nothing was removed\n"
            )
    assert grown.returncode != 0 and "Traceback" not in grown.stderr
    message = (
        f"the store lab lacks 2 of the 10 unique sequences of this run, and {tmp_path}/lab "
        "cannot be written: Read-only file system (EROFS). Set `store` to a folder you can write"
    )
    assert message in grown.stderr
    assert message in (tmp_path / "third" / "logs" / "shard.log").read_text()
    assert not (tmp_path / "third" / "shards").exists()
    assert {p: p.read_bytes() for p in (tmp_path / "lab").rglob("*") if p.is_file()} == before


def test_a_read_only_outdir_or_export_folder_is_named_in_one_line(tmp_path):
    fasta(tmp_path / "a.fasta", A[:4])
    snakemake(tmp_path, {}, *config("a.fasta", "out", "shards=1"))
    (tmp_path / "shelf").mkdir()
    (tmp_path / "shelf" / "mine.txt").write_text("a file of the user's\n")
    with read_only(tmp_path / "shelf"):
        done = snakemake(tmp_path, {}, *config("a.fasta", "shelf/out"), check=False)
        assert done.returncode != 0 and "Traceback" not in done.stderr
        assert (
            f"outdir 'shelf/out': {tmp_path}/shelf cannot be written: Read-only file system "
            "(EROFS); choose a folder you can write for `outdir`"
        ) in done.stderr
        export = cli("export", "out", "--format", "npy", "--out", "shelf/npy", cwd=tmp_path)
        assert export.returncode == 1 and export.stderr == (
            f"esmshard export: {tmp_path}/shelf cannot be written: Read-only file system "
            "(EROFS); choose another --out\n"
        )
    assert [p.name for p in (tmp_path / "shelf").iterdir()] == ["mine.txt"]


@pytest.mark.parametrize(
    "typed, message",
    [
        (["input=missing.fasta"], "input FASTA 'missing.fasta' does not exist; set `input`"),
        (["input=empty.fasta"], "empty.fasta: no FASTA records (the file is empty or has no"),
        (["store=a.fasta"], "store 'a.fasta' is a file; choose a folder for `store`"),
        (["store=out/shards"], "store 'out/shards' is where this run writes its own files"),
        (["store=out/embeddings.h5"], "store 'out/embeddings.h5' is where this run writes"),
        (["shards=0"], "shards: 0 is not valid; give a whole number of at least 1 or auto"),
        (["gpus=[0,-1]"], "gpus: [0,-1] is not valid; give auto or a list of items each a whole"),
    ],
)
def test_typed_mistakes_are_refused_in_one_line_before_any_model_is_loaded(
    tmp_path, typed, message
):
    before = fasta(tmp_path / "a.fasta", A[:4]).read_bytes()
    (tmp_path / "empty.fasta").write_text("")
    # The input typed replaces config()'s own.
    items = config(next((t[6:] for t in typed if t.startswith("input=")), "a.fasta"), "out")
    done = snakemake(tmp_path, {}, *items, *[t for t in typed if not t.startswith("input=")],
                     check=False)  # fmt: skip
    assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert message in done.stderr
    assert "make run" not in done.stderr  # the command the user ran is what the message speaks of
    assert not (tmp_path / "out" / "logs" / "embed").exists()
    assert (tmp_path / "a.fasta").read_bytes() == before


def test_esmshard_commands_typed_wrong_say_so_in_one_line(tmp_path):
    fasta(tmp_path / "a.fasta", A[:4])
    snakemake(tmp_path, {}, *config("a.fasta", "out", "shards=1"))
    for args, status, message in (
        (["store", "out", "--remove", ""], 1, f"esmshard store: {tmp_path}/out/store holds no "),
        (["gpu-check", "--out", "a.fasta"], 2, "esmshard gpu-check: --out a.fasta: "),
        (["export", "out", "--format", "npy", "--out", "a.fasta/npy"], 1,
         "esmshard export: a.fasta is not a folder; make it, or choose another --out"),
        (["export", "out", "--format", "pt", "--out", "out"], 1, "esmshard export: out exists"),
    ):  # fmt: skip
        done = cli(*args, cwd=tmp_path)
        assert done.returncode == status and done.stderr.startswith(message), done.stderr
        assert len(done.stderr.splitlines()) == 1


def test_a_shards_folder_of_the_users_own_is_not_taken_for_a_damaged_plan(tmp_path):
    # A damaged plan is removed at a run's start (and planned anew) only where the shard step
    # wrote its folder: one without any of its plan files is not esmshard's to remove.
    fasta(tmp_path / "proteins.fasta", A[:5])
    notes = tmp_path / "out" / "shards" / "notes.txt"
    notes.parent.mkdir(parents=True)
    notes.write_text("mine\n")
    done = snakemake(tmp_path, {}, *config("proteins.fasta", "out"), check=False)
    assert "planned anew" not in done.stdout + done.stderr
    assert notes.read_text() == "mine\n"
