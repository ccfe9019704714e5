"""Leftovers of killed writers, removed by the next run: temporary files and folders, and store
manifests whose part never arrived.

Every temporary name ends with its writer's host and process (esmshard.files.writer_suffix).
A writer is dead when, on this host, its process is gone; on another host, when nothing under
its name has changed for as long as `esmshard status` takes a job for dead. A live writer's
files are never touched.
"""

import os
import re
import shutil
import socket
import time
from pathlib import Path

from . import Store
from .runlock import STALE_AFTER_SECONDS, process_alive

TEMPORARY = re.compile(r"^\..*\.(?P<pid>\d+)\.tmp$")


def _newest_change(path: Path) -> float:
    """The latest mtime of `path` and, for a folder, of everything under it."""
    newest = path.lstat().st_mtime
    if path.is_dir() and not path.is_symlink():
        for root, folders, files in os.walk(path):
            for name in folders + files:
                try:
                    newest = max(newest, os.lstat(os.path.join(root, name)).st_mtime)
                except FileNotFoundError:
                    pass
    return newest


def writer_alive(path: Path, now: float) -> bool:
    """Whether the writer of temporary file or folder `path` may still be writing it."""
    pid = int(TEMPORARY.match(path.name)["pid"])
    if path.name.endswith(f".{socket.gethostname()}.{pid}.tmp"):
        return process_alive(pid)
    return now - _newest_change(path) < STALE_AFTER_SECONDS


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def dead_temporaries(folder, now: float) -> tuple[list[Path], list[Path]]:
    """The temporary files and folders under `folder` (not inside another one): (dead, live)."""
    dead, live = [], []
    for root, folders, files in os.walk(folder):
        for name in folders + files:
            if TEMPORARY.match(name):
                path = Path(root, name)
                try:
                    (live if writer_alive(path, now) else dead).append(path)
                except FileNotFoundError:
                    continue  # its writer finished meanwhile
        folders[:] = [name for name in folders if not TEMPORARY.match(name)]
    return dead, live


def orphan_manifests(store: Store, live: list[Path]) -> list[Path]:
    """Store manifests without their part whose part is not being written: an embed job killed
    between the two. `live` (the live temporaries, listed first) keeps a writer's manifest: its
    part, once renamed, appears before its temporary file is gone."""
    being_written = {path.name.split(".h5.", 1)[0].lstrip(".") for path in live}
    orphans = []
    for key in store.settings_keys():
        for manifest in Path(store.folder(key)).glob("*.json"):
            name = manifest.stem
            if manifest.name == "settings.json" or name.startswith("."):
                continue
            if name not in being_written and not os.path.exists(store.part(key, name)):
                orphans.append(manifest)
    return orphans


def remove_leftovers(outdir, store: Store) -> list[Path]:
    """Remove what dead writers left in `outdir` and in `store`; returns what was removed."""
    now = time.time()
    folders = [Path(outdir)]
    if not Path(store.root).resolve().is_relative_to(Path(outdir).resolve()):
        folders.append(Path(store.root))  # a store elsewhere (one inside outdir is walked with it)
    dead, live = [], []
    for folder in folders:
        if folder.is_dir():
            found_dead, found_live = dead_temporaries(folder, now)
            dead += found_dead
            live += found_live
    removed = dead + orphan_manifests(store, live)
    for path in removed:
        _remove(path)
    return removed
