"""The store: embeddings already computed, kept by sequence content and by the settings that made them.

Layout of a store directory (config `store`, by default `outdir/store`; several outdirs and
runs may share one):

    <store>/<key>/settings.json    the embedding settings (esmshard.config.embedding_settings)
    <store>/<key>/<part>.h5        one embed job's results (esmshard.store.shardfile), never rewritten
    <store>/<key>/<part>.json      its manifest: the file's sha256 and size, and its sequences

`key` is a hash of the settings, so that sequences computed with other settings are never
found. A part counts once its `.h5` exists: the manifest is written before the `.h5` is renamed
into place, and both are written atomically, so two runs adding parts at once never see each
other's half-written files. A part whose file fails its manifest's sha256 or size, or that is
not what its name says (another shard's, or computed with other settings), is set aside with its
manifest (both renamed `.corrupt`) and its sequences are computed again.

Sequences are matched on the first 128 bits of their SHA-256: a chance of a false match of
about n²/2¹²⁹, 10⁻¹⁵ for a trillion sequences.
"""

import hashlib
import json
import logging
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import h5py
import numpy as np

from ..embeddings_h5.in_place import is_in_place, part_paths
from ..files import remove_whole, write_json
from ..input.records import read_columns, shard_codes
from ..layout import Layout
from . import storelock
from .checksums import file_checksums, sha256

log = logging.getLogger(__name__)

KEY_BYTES = 16
KEY_DTYPE = np.dtype(f"S{KEY_BYTES}")
_HEX_VALUES = np.full(256, 255, dtype=np.uint8)
for _digit, _value in zip(b"0123456789abcdef", range(16)):
    _HEX_VALUES[_digit] = _value


def sequence_sha256(sequence: bytes) -> str:
    """The key of a sequence (its residues after the input rules), as lowercase hex."""
    return hashlib.sha256(sequence).hexdigest()


def keys_of(hex_digests) -> np.ndarray:
    """The 128-bit keys (KEY_DTYPE) of hex SHA-256 digests (str, bytes or an array of them)."""
    text = np.asarray(hex_digests, dtype="S64")
    nibbles = _HEX_VALUES[text.view(np.uint8).reshape(-1, 64)[:, : 2 * KEY_BYTES]]
    if np.any(nibbles == 255):
        raise ValueError("not a lowercase hex SHA-256 digest")
    return (nibbles[:, 0::2] << 4 | nibbles[:, 1::2]).copy().view(KEY_DTYPE).ravel()


def rows_of(held: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """The row of each of `keys` among the keys `held` (in any order), or -1 where absent."""
    if not held.size:
        return np.full(keys.size, -1, dtype=np.int64)
    order = np.argsort(held, kind="stable")
    ordered = held[order]
    at = np.minimum(np.searchsorted(ordered, keys), held.size - 1)
    return np.where(ordered[at] == keys, order[at], -1)


def settings_key(settings: dict) -> str:
    """The name of the store folder for embeddings computed with `settings`."""
    text = json.dumps(settings, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


# A settings folder's name is its key, 16 lowercase hex digits, and its settings.json holds the
# settings whose hash that key is (`settings_key`): esmshard's mark on it. No other folder of the
# store's root (a user's `.vscode/` or `analysis/`, or `cafebabedeadbeef/` holding a
# settings.json of its own) is ever read as one, listed, cleaned up or removed.
SETTINGS_KEY = re.compile(r"^[0-9a-f]{16}$")
# esmshard marks the root of every store it writes in, with the format of its layout. A store of
# an earlier esmshard (settings folders, no marker) is recognised by them and marked by its next run.
MARKER = ".esmshard-store.json"
# Compiled layers kept for later jobs (esmshard.compute.compiled), one file per key.
COMPILED = ".compiled"
# What interrupted embed jobs kept, in each settings folder (esmshard.store.pieces).
PIECES = ".pieces"
STORE_FORMAT = 1


class NotAStoreError(ValueError):
    """A folder that is not an esmshard store was given where one is needed."""


class StoreReadOnlyError(ValueError):
    """A run would add parts to a store that cannot be written."""


@dataclass(frozen=True)
class Store:
    root: str

    def folder(self, key: str) -> str:
        return os.path.join(self.root, key)

    def part(self, key: str, name: str) -> str:
        return os.path.join(self.root, key, f"{name}.h5")

    def manifest(self, key: str, name: str) -> str:
        return os.path.join(self.root, key, f"{name}.json")

    def settings(self, key: str) -> str:
        return os.path.join(self.root, key, "settings.json")

    @property
    def marker(self) -> str:
        return os.path.join(self.root, MARKER)

    @property
    def compiled(self) -> str:
        return os.path.join(self.root, COMPILED)

    def settings_keys(self) -> list[str]:
        """The settings held, by key: the folders that bear esmshard's mark."""
        if not os.path.isdir(self.root):
            return []
        return sorted(k for k in os.listdir(self.root) if self.is_settings_folder(k))

    def is_settings_folder(self, name: str) -> bool:
        """Whether `name` is one of esmshard's settings folders: named by a key, and holding
        the settings that hash to it (stores of every earlier version wrote them so)."""
        if not SETTINGS_KEY.match(name):
            return False
        settings = read_json_object(Path(self.settings(name)))
        return settings is not None and settings_key(settings) == name

    def foreign(self) -> list[str]:
        """What the store's root holds that esmshard did not write: a user's, left alone."""
        if not os.path.isdir(self.root):
            return []
        own = {MARKER, COMPILED, storelock.LOCKS, *self.settings_keys()}
        return sorted(name for name in os.listdir(self.root) if name not in own)

    def is_store(self) -> bool:
        """Whether esmshard wrote here: its marker, or settings folders of an earlier version."""
        return os.path.isfile(self.marker) or bool(self.settings_keys())

    def checked(self) -> "Store":
        """This store, or NotAStoreError if `root` is no esmshard store (maintenance acts only
        on esmshard's own stores)."""
        if not self.is_store():
            raise NotAStoreError(
                f"{self.root} is not an esmshard store (no {MARKER} and no settings folders); "
                "give a store a run wrote, or that run's outdir"
            )
        return self

    def pieces(self, key: str) -> dict[str, Path]:
        """The shards under `key` with kept pieces (esmshard.store.pieces): their folders."""
        folder = Path(self.folder(key)) / PIECES
        if not folder.is_dir():
            return {}
        return {p.name: p for p in sorted(folder.iterdir()) if p.is_dir()}

    def parts(self, key: str) -> list[str]:
        """The parts present under `key` (a part is present once its .h5 is in place)."""
        folder = Path(self.folder(key))
        if not folder.is_dir():
            return []
        return sorted(p.stem for p in folder.glob("*.h5") if not p.name.startswith("."))


def read_json_object(path: Path) -> dict | None:
    """The JSON object in `path`, or None if it is missing, unreadable or of another shape."""
    try:
        found = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def mark(store: Store) -> None:
    """Mark `store`'s root as esmshard's, once (atomic: concurrent runs write the same file)."""
    if not os.path.isfile(store.marker):
        os.makedirs(store.root, exist_ok=True)
        try:
            write_json(store.marker, {"esmshard_store_format": STORE_FORMAT})
        except PermissionError:
            pass  # a read-only store of an earlier version: its settings folders mark it


def written_by_layout(path, layout: Layout) -> str | None:
    """The outdir's own file or folder (`layout`'s) that `path` is or lies in."""
    return _written_in(Path(path).resolve(), layout.own_files, layout.own_folders)


def _written_in(target: Path, files: list[str], folders: list[str]) -> str | None:
    for own in files:
        if target == Path(own).resolve():
            return own
    for folder in folders:
        if target.is_relative_to(Path(folder).resolve()):
            return folder
    return None


def written_by_run(path, layout: Layout, store: Store) -> str | None:
    """The file or folder that a run of `layout` and `store` writes and `path` is or lies in:
    such a path cannot be an input (the run would overwrite or remove it)."""
    target = Path(path).resolve()
    folders = layout.own_folders + [os.path.join(store.root, storelock.LOCKS)]
    root = Path(store.root).resolve()
    first = target.relative_to(root).parts[:1] if target.is_relative_to(root) else ()
    if first and SETTINGS_KEY.match(first[0]):
        folders.append(store.folder(first[0]))
    return _written_in(target, layout.own_files + [store.marker], folders)


def add_settings(store: Store, key: str, settings: dict) -> None:
    """Record what `key` stands for, once (atomic: concurrent runs write the same file)."""
    mark(store)
    path = Path(store.settings(key))
    if read_json_object(path) != settings:  # missing, or damaged: what `key` stands for is known
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json(path, settings)


def write_manifest(path, part_file, n_sequences: int) -> None:
    """The manifest of a part about to be renamed into place from `part_file`."""
    write_json(
        path,
        {
            "sha256": sha256(part_file),
            "bytes": os.path.getsize(part_file),
            "n_sequences": n_sequences,
        },
    )


def part_keys(path) -> np.ndarray:
    """The keys of the sequences that a part holds embeddings of (its failures excluded)."""
    with h5py.File(path, "r") as h5:
        return keys_of(h5["sequence_sha256"][:])


def part_problem(store: Store, key: str, name: str) -> str | None:
    """None if the part is the one its name says: shard `name`, computed with the settings `key`
    stands for (a part copied in from another shard, model or store is not); else what it is."""
    try:
        with h5py.File(store.part(key, name), "r") as h5:
            shard, found = h5.attrs.get("shard"), json.loads(h5.attrs["settings"])
    except (OSError, KeyError, ValueError) as err:
        return f"unreadable ({err})"
    if settings_key(found) != key:
        try:
            wanted = json.loads(Path(store.settings(key)).read_text())
        except (OSError, ValueError):
            wanted = {}
        differ = [k for k in sorted(set(found) | set(wanted)) if found.get(k) != wanted.get(k)]
        named = ", ".join(
            f"{k} = {json.dumps(found.get(k))} where the store has {json.dumps(wanted.get(k))}"
            for k in differ[:3]
        )
        return f"it was computed with other settings ({named or 'not those of ' + key})"
    if shard != name:
        return f"it holds shard {shard}, not {name} (copied from another shard?)"
    return None


def check_part(store: Store, key: str, name: str, checksum_cache) -> str | None:
    """None if the part is whole (its manifest's size and sha256) and is what its name says
    (`part_problem`); else what is wrong with it."""
    problem = check_file(store.part(key, name), store.manifest(key, name), checksum_cache)
    return problem or part_problem(store, key, name)


def check_file(part, manifest, checksum_cache=None) -> str | None:
    """None if the file `part` is as its manifest says (size and sha256; `checksum_cache`, if
    given, answers for a file that has not changed since it was hashed); else what is wrong."""
    if not os.path.exists(part):
        return "its file is gone"
    if not os.path.isfile(part):
        return "it is not a file"
    try:
        expected = json.loads(Path(manifest).read_text())
    except (OSError, ValueError) as err:
        return f"no readable manifest ({err})"
    if not isinstance(expected, dict):
        return f"its manifest holds {type(expected).__name__} JSON, not a manifest"
    size = os.path.getsize(part)
    if size != expected.get("bytes"):
        return f"{size} bytes where its manifest says {expected.get('bytes')}"
    (found,) = file_checksums([part], checksum_cache) if checksum_cache else [sha256(part)]
    if found != expected.get("sha256"):
        return f"sha256 {found} where its manifest says {expected.get('sha256')}"
    return None


SET_ASIDE = ".corrupt"  # the suffix of a part (and its manifest) that failed its check


def set_aside(store: Store, key: str, name: str, reason: str) -> list[str]:
    """Move a part that failed its check, and its manifest, out of the way, so that no run uses
    them again (`esmshard store --prune` removes them); returns where they went."""
    return set_aside_file(store.part(key, name), store.manifest(key, name), reason)


def set_aside_file(part, manifest, reason: str) -> list[str]:
    """`set_aside` for a file of a part's layout (a part, a kept piece) and its manifest."""
    moved, kept = [], ""
    for path in (part, manifest):
        try:
            os.replace(path, path + SET_ASIDE)
            moved.append(path + SET_ASIDE)
        except FileNotFoundError:
            pass  # another run set it aside first, or the part never had one
        except OSError as err:  # a store that cannot be written: the part stays, unused
            kept = f"left in place ({err.strerror})"
    log.warning(
        "store part %s fails its check (%s): %s, its sequences are recomputed",
        part,
        reason,
        kept or "set aside as " + (" and ".join(moved) or "(already gone)"),
    )
    return moved


def manifest_count(value) -> int:
    """A count read from a manifest; a damaged one (missing, null, text) counts 0."""
    return value if isinstance(value, int) and value >= 0 else 0


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
    and against what its name says; set the damaged ones aside, as a run would."""
    n_parts, n_pieces, damaged = 0, 0, []
    with tempfile.TemporaryDirectory() as scratch:
        no_cache = Path(scratch) / "checksums.json"
        for key in store.settings_keys():
            for name in store.parts(key):
                n_parts += 1
                reason = check_part(store, key, name, no_cache)
                if reason:
                    set_aside(store, key, name, reason)
                    damaged.append((store.part(key, name), reason))
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
    return [f"{parts[index]} {what}" for index, what in changed_files(parts, checksum_cache)]


def _read_in_place(layout: Layout) -> set:
    """The parts, as (key, name), that the outdir's embeddings.h5 reads in place
    (esmshard.embeddings_h5.in_place); none for a copy, or a file that cannot be read."""
    try:
        with h5py.File(layout.embeddings, "r") as h5:
            parts = part_paths(h5, layout.embeddings) if is_in_place(h5) else []
    except (OSError, KeyError):
        return set()
    return {(part.parent.name, part.stem) for part in parts}


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
