"""The store's upkeep: what it holds, what is unused, what is damaged, and removing it.

Each removal takes only what esmshard wrote: settings folders, their parts and pieces.
"""

import json
import os
import tempfile
from pathlib import Path
from typing import NamedTuple

import h5py
import numpy as np

from ..embeddings_h5.in_place import is_in_place, part_paths
from ..files import is_object_url, remove_whole
from ..input.records import read_columns, shard_codes
from ..layout import Layout
from . import storelock
from .checksums import file_checksums
from .keys import settings_key
from .parts import (
    SET_ASIDE,
    check_file,
    check_part,
    index_parts,
    manifest_count,
    set_aside,
    set_aside_file,
)
from .store import Store, read_json_object


def summary(store: Store) -> list[dict]:
    """Per settings key: the settings, the parts, the sequences and the bytes held."""
    rows = []
    for key in store.settings_keys():
        settings = read_json_object(Path(store.settings(key)))
        if settings is None:  # the next run with these settings writes it anew
            settings = {"settings.json": "damaged"}
        n_sequences = n_bytes = 0
        parts = store.parts(key)
        for name in parts:
            manifest = read_json_object(Path(store.manifest(key, name))) or {}
            n_sequences += manifest_count(manifest.get("n_sequences"))
            n_bytes += manifest_count(manifest.get("bytes"))
        kept = [
            read_json_object(manifest) or {}
            for folder in store.pieces(key).values()
            for manifest in piece_manifests(folder)
        ]
        rows.append(
            {
                "key": key,
                "settings": settings,
                "parts": len(parts),
                "sequences": n_sequences,
                "bytes": n_bytes,
                "pieces": len(kept),
                # embedded and failed, as the jobs count what they find kept
                "piece_sequences": sum(
                    manifest_count(m.get("n_sequences")) + manifest_count(m.get("n_failed"))
                    for m in kept
                ),
                "piece_bytes": sum(manifest_count(m.get("bytes")) for m in kept),
            }
        )
    return rows


def remove(store: Store, key: str) -> None:
    """Remove every entry computed with the settings `key`, unless a run uses them
    (esmshard.store.storelock.StoreBusyError)."""
    if key not in store.settings_keys():
        raise KeyError(
            f"{store.root} holds no settings {key!r}; `esmshard store {store.root}` lists them"
        )
    with storelock.exclusive(store.root, [key], "remove"):
        remove_whole(store.folder(key))


class Verified(NamedTuple):
    n_parts: int
    damaged: list[tuple[str, str]]  # (part or piece, what is wrong with it), each now set aside
    n_pieces: int = 0


def piece_files(folder: Path) -> list[Path]:
    """The kept pieces in place in a shard's pieces folder (esmshard.store.pieces), in the order
    they were written."""
    if not folder.is_dir():
        return []
    return sorted((p for p in folder.glob("*.h5") if p.stem.isdigit()), key=lambda p: int(p.stem))


def piece_manifests(folder: Path) -> list[Path]:
    """The manifests of the kept pieces in place in a shard's pieces folder: a piece's manifest
    is written just before the piece is put in place, and one alone (its job killed in between)
    stands for nothing kept."""
    return [piece.with_suffix(".json") for piece in piece_files(folder)]


def piece_problem(piece: Path, key: str, shard: str) -> str | None:
    """None if the kept piece is whole (its manifest) and is shard `shard`'s, computed with the
    settings `key` stands for; else what is wrong with it."""
    problem = check_file(piece, piece.with_suffix(".json"))
    if problem:
        return problem
    try:
        with h5py.File(piece, "r") as h5:
            found, settings = h5.attrs.get("shard"), json.loads(h5.attrs["settings"])
    except (OSError, KeyError, ValueError) as err:
        return f"unreadable ({err})"
    if found != shard or settings_key(settings) != key:
        return f"it holds shard {found} with other settings, not {shard}'s"
    return None


def verify(store: Store) -> Verified:
    """Check every part and kept piece against its manifest (its bytes hashed now, no cache)
    and against what its name says; set the damaged ones aside, as a run would. In object
    storage, the whole parts are then indexed (parts copied in by hand among them)."""
    n_parts, n_pieces, damaged = 0, 0, []
    with tempfile.TemporaryDirectory() as scratch:
        no_cache = Path(scratch) / "checksums.json"
        for key in store.settings_keys():
            whole = []
            for name in store.parts(key):
                n_parts += 1
                reason = check_part(store, key, name, no_cache)
                if reason:
                    set_aside(store, key, name, reason)
                    damaged.append((store.part(key, name), reason))
                else:
                    whole.append(name)
            if store.key_index(key) is not None:
                index_parts(store, key, whole, every=True)
            for shard, folder in store.pieces(key).items():
                for piece in piece_files(folder):
                    n_pieces += 1
                    reason = piece_problem(piece, key, shard)
                    if reason:
                        set_aside_file(str(piece), str(piece.with_suffix(".json")), reason)
                        damaged.append((str(piece), reason))
    return Verified(n_parts, damaged, n_pieces)


class Unused(NamedTuple):
    path: str
    bytes: int


def unused(store: Store, keep_outdirs) -> list[Unused]:
    """The files that no outdir of `keep_outdirs` uses: parts (and their manifests) that none of
    their current record tables names nor their embeddings.h5 reads in place, and parts set
    aside."""
    used = set()  # (key, part)
    for outdir in keep_outdirs:
        layout = Layout(str(outdir))
        in_place = _read_in_place(layout)
        key = (read_json_object(Path(layout.plan_json)) or {}).get("key")
        if not isinstance(key, str):
            if in_place:  # the plan removed, the output still reading the store
                used |= in_place
                continue
            raise ValueError(
                f"{outdir} is not the outdir of a planned run (no readable {layout.plan_json}); "
                "name outdirs whose shard step has run"
            )
        try:
            codes, names = shard_codes(read_columns(layout.records, ["shard"]))
        except (OSError, ValueError, KeyError) as err:
            raise ValueError(
                f"{outdir} is not the outdir of a planned run ({err}); name outdirs whose "
                "shard step has run"
            ) from err
        used.update((key, names[code]) for code in np.unique(codes))
        used |= in_place
    found = []
    for key in store.settings_keys():
        folder = Path(store.folder(key))
        for name in store.parts(key):
            if (key, name) not in used:
                found += [store.part(key, name), store.manifest(key, name)]
        # kept pieces: of a shard no outdir plans, or whose part is in place (they are in it)
        parts = set(store.parts(key))
        found += [
            str(pieces)
            for shard, pieces in store.pieces(key).items()
            if (key, shard) not in used or shard in parts
        ]
        # what set_aside renamed, by its names only: a part's .h5 and its manifest's .json
        found += [
            str(p) for suffix in (".h5", ".json") for p in folder.glob(f"*{suffix}{SET_ASIDE}")
        ]
    return [Unused(p, tree_bytes(p)) for p in found if os.path.lexists(p)]


def changed_files(parts: list[Path], checksum_cache) -> list[tuple[int, str]]:
    """(index, what) for each of `parts` (files of a part's layout, their manifests beside
    them) that is gone or differs from its manifest: its size, or its sha256, hashed only where
    the file changed since `checksum_cache` saw it (one reading of the cache for them all)."""
    problems, present, expected = [], [], {}
    for index, part in enumerate(parts):
        manifest = read_json_object(part.with_suffix(".json"))
        if not part.is_file():
            problems.append((index, "is gone"))
        elif manifest is None:
            problems.append((index, "has no readable manifest"))
        elif part.stat().st_size != manifest.get("bytes"):
            size = part.stat().st_size
            problems.append(
                (index, f"has {size} bytes where its manifest says {manifest.get('bytes')}")
            )
        else:
            present.append(index)
            expected[index] = manifest.get("sha256")
    found = file_checksums([parts[i] for i in present], checksum_cache) if present else []
    for index, digest in zip(present, found):
        if digest != expected[index]:
            problems.append(
                (index, f"has changed: sha256 {digest} where its manifest says {expected[index]}")
            )
    return sorted(problems)


def in_place_problems(embeddings, checksum_cache) -> list[str]:
    """What is wrong with the store parts that the in-place embeddings.h5 at `embeddings` reads
    (`changed_files`); [] for a copy, or where there is no file."""
    try:
        with h5py.File(embeddings, "r") as h5:
            parts = part_paths(h5, embeddings) if is_in_place(h5) else []
    except (OSError, KeyError):
        return []
    parts = [part for part in parts if not is_object_url(part)]  # objects: their ETags
    return [f"{parts[index]} {what}" for index, what in changed_files(parts, checksum_cache)]


def _read_in_place(layout: Layout) -> set:
    """The parts, as (key, name), that the outdir's embeddings.h5 reads in place
    (esmshard.embeddings_h5.in_place); none for a copy, or a file that cannot be read."""
    try:
        with h5py.File(layout.embeddings, "r") as h5:
            parts = part_paths(h5, layout.embeddings) if is_in_place(h5) else []
    except (OSError, KeyError):
        return set()
    return {(part.parent.name, part.stem) for part in parts if not is_object_url(part)}


def tree_bytes(path) -> int:
    """The bytes of a file, or of every file under a folder (a part set aside may be one)."""
    path = Path(path)
    if path.is_symlink() or not path.is_dir():
        return path.lstat().st_size
    return sum(f.lstat().st_size for f in path.rglob("*") if f.is_symlink() or f.is_file())


def prune(files: list[Unused]) -> None:
    """Remove `files` (from `unused`, listed under the store's exclusive lock, still held)."""
    for f in files:
        path = Path(f.path)
        if path.is_dir() and not path.is_symlink():  # kept pieces, or a folder set aside as a part
            remove_whole(path)
        else:
            path.unlink(missing_ok=True)
