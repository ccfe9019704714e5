"""Leftovers of killed writers: removed when their writer is dead, never when it lives, and
never a user's file whatever its name."""

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from esmshard.store import Store, settings_key
from esmshard.store.leftovers import remove_leftovers
from esmshard.store.runlock import STALE_AFTER_SECONDS

HOST = socket.gethostname()


def dead_pid() -> int:
    """The pid of a process of this host that has exited."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def age(path: Path, seconds: float) -> Path:
    then = time.time() - seconds
    os.utime(path, (then, then))
    return path


def test_dead_writers_leftovers_go_and_live_ones_stay(tmp_path):
    outdir = tmp_path / "results"
    store = Store(str(outdir / "store"))
    settings = {"model": "random:esm2_t6_8M_UR50D"}  # a settings folder bears its key's hash
    key = Path(store.folder(settings_key(settings)))
    key.mkdir(parents=True)
    (key / "settings.json").write_text(json.dumps(settings))
    dead, live = dead_pid(), os.getpid()
    spill = outdir / f".merge-spill-x1y2.esmshard-{HOST}-{dead}.tmp"  # a folder, with its contents
    spill.mkdir(parents=True)
    (spill / "0.rows").write_bytes(b"\0" * 8)
    gone = [
        spill,
        outdir / f".shards.esmshard-{HOST}-{dead}.tmp",
        age(
            _touch(outdir / "metrics" / f".a-0000.json.esmshard-node7.cluster-{live}.tmp"),
            2 * 3600,
        ),
        _touch(key / f".p-0001.h5.esmshard-{HOST}-{dead}.tmp"),
        _touch(key / "p-0001.json"),  # its manifest: the part never arrived
        # a compiled layer's entry whose job was killed while writing it
        _touch(Path(store.compiled) / f".0123abcd.entry.esmshard-{HOST}-{dead}.tmp"),
    ]
    (outdir / f".shards.esmshard-{HOST}-{dead}.tmp").mkdir()
    kept = [
        _touch(key / f".p-0002.h5.esmshard-{HOST}-{live}.tmp"),  # being written now
        _touch(key / "p-0002.json"),  # its manifest, written before the part is renamed
        _touch(key / "p-0003.h5"),
        _touch(key / "p-0003.json"),
        _touch(
            outdir / "metrics" / f".b-0000.json.esmshard-node7.cluster-{dead}.tmp"
        ),  # fresh, elsewhere
        _touch(outdir / "embeddings.h5"),
        _touch(Path(store.compiled) / "0123abcd.entry"),
    ]
    # A user's files beside the outputs and in the store, old enough and named like temporaries
    # of a dead process, or like a settings folder: none is esmshard's.
    users = [
        age(_touch(outdir / "notes" / f".draft.{dead}.tmp"), 2 * 3600),
        age(_touch(outdir / f".mine.{HOST}.{dead}.tmp"), 2 * 3600),
        age(_touch(outdir / ".sync.777.tmp" / "state"), 2 * 3600),
        age(_touch(outdir / "shards" / "mine" / f".x.{dead}.tmp"), 2 * 3600),
        _touch(outdir / "store" / ".vscode" / "settings.json"),
        _touch(outdir / "store" / ".vscode" / "launch.json"),
        _touch(outdir / "store" / "analysis" / "settings.json"),
        _touch(outdir / "store" / "analysis" / "tasks.json"),
    ]
    age(outdir / ".sync.777.tmp", 2 * 3600)
    kept += users
    assert sorted(remove_leftovers(outdir, store)) == sorted(gone)
    assert not any(p.exists() for p in gone) and all(p.exists() for p in kept)
    assert remove_leftovers(outdir, store) == []


def test_an_old_folder_elsewhere_with_a_fresh_file_inside_is_alive(tmp_path):
    spill = tmp_path / ".merge-spill-ab.esmshard-node7-4242.tmp"
    spill.mkdir()
    _touch(spill / "0.data")
    age(spill, STALE_AFTER_SECONDS + 60)
    assert remove_leftovers(tmp_path, Store(str(tmp_path / "store"))) == []
    age(spill / "0.data", STALE_AFTER_SECONDS + 60)
    assert remove_leftovers(tmp_path, Store(str(tmp_path / "store"))) == [spill]


def _touch(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({}))
    return path


def test_a_settings_folder_whose_remover_is_killed_midway_is_gone_whole(tmp_path):
    """`esmshard store --remove` (and `--prune --apply` of a folder) renames the folder before it
    removes its files: killed after the first file, none of it stays under its name, and what
    is left is a dead writer's temporary, which the next run removes."""
    store = Store(str(tmp_path / "store"))
    settings = {"model": "random:esm2_t6_8M_UR50D"}
    key = settings_key(settings)
    folder = Path(store.folder(key))
    folder.mkdir(parents=True)
    (folder / "settings.json").write_text(json.dumps(settings))
    for shard in range(20):
        (folder / f"{shard:05d}.h5").write_bytes(b"part")
    script = f"""
import os, shutil, signal
from esmshard.store import Store, remove
def killed_after_one_file(path, *args, **kwargs):
    os.unlink(min(os.scandir(path), key=lambda entry: entry.name).path)
    os.kill(os.getpid(), signal.SIGKILL)
shutil.rmtree = killed_after_one_file
remove(Store({store.root!r}), {key!r})
"""
    assert subprocess.run([sys.executable, "-c", script]).returncode == -9
    assert store.settings_keys() == [] and not folder.exists()
    (doomed,) = [p for p in Path(store.root).iterdir() if p.name.startswith(f".{key}.esmshard-")]
    assert len(list(doomed.iterdir())) == 20  # settings.json and 19 parts, under no key's name
    assert remove_leftovers(tmp_path / "results", store) == [doomed] and not doomed.exists()
