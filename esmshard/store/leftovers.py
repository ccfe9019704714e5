"""Leftovers of killed writers, removed by the next run: temporary files and folders, store
manifests whose part never arrived, and kept pieces whose part did.

Every temporary name ends with esmshard's mark, its writer's host and process
(esmshard.files.writer_suffix), and only such names are removed, only where esmshard writes: the
outdir's top level and its own folders (esmshard.layout.Layout.own_folders), and the store's top
level, lock folder, compiled-layer folder and settings folders. A user's files beside the outputs, whatever their
names, are never touched. A writer is dead when, on this host, its process is gone; on another
host, when nothing under its name has changed for as long as `esmshard status` takes a job for
dead. A live writer's files are never touched.
"""

import glob
import os
import shutil
import socket
import time
from pathlib import Path

from ..files import TEMPORARY_NAME
from ..layout import Layout
from . import PIECES, Store
from .passes import passes_files
from .runlock import STALE_AFTER_SECONDS, process_alive
from .storelock import LOCKS


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
    name = TEMPORARY_NAME.match(path.name)
    if name["host"] == socket.gethostname():
        return process_alive(int(name["pid"]))
    return now - _newest_change(path) < STALE_AFTER_SECONDS


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def dead_temporaries(folder, now: float, recursive: bool) -> tuple[list[Path], list[Path]]:
    """esmshard's temporary files and folders in `folder` (below it too if `recursive`, but not
    inside another temporary one): (dead, live)."""
    dead, live = [], []
    for root, folders, files in os.walk(folder):
        for name in folders + files:
            if TEMPORARY_NAME.match(name):
                path = Path(root, name)
                try:
                    (live if writer_alive(path, now) else dead).append(path)
                except FileNotFoundError:
                    continue  # its writer finished meanwhile
        folders[:] = [n for n in folders if recursive and not TEMPORARY_NAME.match(n)]
    return dead, live


def remove_dead_temporaries_of(path) -> list[Path]:
    """Remove what dead writers of `path` left beside it (its temporary names); returns them."""
    path = Path(path)
    dead = [
        p
        for p in path.parent.glob(f".{glob.escape(path.name)}.esmshard-*.tmp")
        if TEMPORARY_NAME.match(p.name) and not writer_alive(p, time.time())
    ]
    for found in dead:
        _remove(found)
    return dead


def orphan_manifests(store: Store, keys: list[str], live: list[Path]) -> list[Path]:
    """Manifests in the settings folders `keys` without their part whose part is not being
    written: an embed job killed between the two. `live` (the live temporaries, listed first) keeps a writer's manifest: its
    part, once renamed, appears before its temporary file is gone."""
    being_written = {path.name.split(".h5.", 1)[0].lstrip(".") for path in live}
    orphans = []
    for key in keys:
        for manifest in Path(store.folder(key)).glob("*.json"):
            name = manifest.stem
            if manifest.name == "settings.json" or name.startswith("."):
                continue
            if name not in being_written and not os.path.exists(store.part(key, name)):
                orphans.append(manifest)
    return orphans


def done_pieces(store: Store, keys: list[str], live: list[Path]) -> list[Path]:
    """Kept pieces' folders of shards whose part is in place (a job killed between putting its
    part in place and removing its pieces: the part holds them), and those that hold no piece
    and no live writer's file (what a killed job or call left of its first piece)."""
    writing = {path.parent for path in live}
    return [
        folder
        for key in keys
        for shard, folder in store.pieces(key).items()
        if os.path.exists(store.part(key, shard))
        or (
            not any(p.stem.isdigit() for p in folder.glob("*.h5"))
            and not passes_files(folder)
            and folder not in writing
        )
    ]


def remove_leftovers(outdir, store: Store | None) -> list[Path]:
    """Remove what dead writers left in `outdir` and in `store` (None: a store that cannot be
    written, left alone); returns what was removed."""
    now = time.time()
    flat = [Path(outdir)]
    own = [Path(p) for p in Layout(str(outdir)).own_folders]
    keys = store.settings_keys() if store else []
    if store:
        flat.append(Path(store.root))
        own += [Path(store.root, LOCKS), Path(store.compiled)]
        own += [Path(store.folder(k)) for k in keys]
    dead, live = [], []
    for folders, recursive in ((flat, False), (own, True)):
        for folder in dict.fromkeys(folders):  # a store may be the outdir itself
            if folder.is_dir():
                found_dead, found_live = dead_temporaries(folder, now, recursive)
                dead += found_dead
                live += found_live
    removed = dead
    if store:
        removed += orphan_manifests(store, keys, live) + done_pieces(store, keys, live)
    for path in removed:
        _remove(path)
    for key in keys:  # `.pieces/` once no shard has any
        try:
            Path(store.folder(key), PIECES).rmdir()
        except OSError:
            pass
    return removed
