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
"""

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from ..files import write_json
from ..layout import Layout
from . import storelock
from .key_index import KeyIndex
from .keys import SETTINGS_KEY, settings_key

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
    # where the store lies for the user, where a job reads a local copy of it (an object
    # store's URL); None: at `root`
    url: str | None = None
    # a job's partial copy of an object store at `root` (esmshard.store.mirror.Mirror): the
    # parts it lists, each part's file fetched when first opened; None: the store is `root`
    copy: object = field(default=None, compare=False, repr=False)

    @classmethod
    def at(cls, root) -> "Store":
        """The store a step is given: a Store (a job's copy of an object store), or a folder."""
        return root if isinstance(root, Store) else cls(str(root))

    @property
    def name(self) -> str:
        """Where the store is, as the user finds it: its URL, or its folder."""
        return self.url or self.root

    def shown(self, path: str) -> str:
        """`path`, a file of the store, as the user finds it: under `url` where there is one."""
        if self.url is None:
            return path
        return f"{self.url.rstrip('/')}/{self.relative(path)}"

    def relative(self, path: str) -> str:
        """`path`, a file of the store, relative to its root (an object's relative key)."""
        return Path(os.path.relpath(path, self.root)).as_posix()

    def etag(self, path: str) -> str | None:
        """The ETag of `path`'s object where this is a job's copy of an object store."""
        if self.copy is None:
            return None
        return self.copy.etag(self.relative(path))

    def local(self, path: str) -> str:
        """`path`, a file of the store, on this machine: a partial copy fetches it first."""
        if self.copy is not None:
            self.copy.fetch(self.relative(path))
        return path

    def key_index(self, key: str) -> KeyIndex | None:
        """The index of `key`'s sequences in the object store of a job's copy (None: a folder)."""
        return None if self.copy is None else KeyIndex(self.copy.bucket, key)

    @property
    def lists_parts(self) -> bool:
        """Whether the parts are listed: a folder's, or a copy's that listed its key's folder
        (else the key's index names the parts that hold a run's sequences)."""
        return self.copy is None or self.copy.listed_folders

    def folder(self, key: str) -> str:
        return os.path.join(self.root, key)

    def part(self, key: str, name: str) -> str:
        return os.path.join(self.root, key, f"{name}.h5")

    def manifest(self, key: str, name: str) -> str:
        """Part `name`'s manifest (a partial copy fetches it first, where it is listed)."""
        return self.local(os.path.join(self.root, key, f"{name}.json"))

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
                f"{self.name} is not an esmshard store (no {MARKER} and no settings folders); "
                "give a store a run wrote, or that run's outdir"
            )
        return self

    def present(self, key: str, names: list[str]) -> list[str]:
        """Those of parts `names` under `key` that are there (a copy looks each up, with its
        manifest, in the object store)."""
        if self.copy is not None:
            wanted = [f"{key}/{name}{suffix}" for name in names for suffix in (".h5", ".json")]
            found = self.copy.look_up(wanted)
            return [name for name in names if f"{key}/{name}.h5" in found]
        return [name for name in names if os.path.isfile(self.part(key, name))]

    def pieces(self, key: str) -> dict[str, Path]:
        """The shards under `key` with kept pieces (esmshard.store.pieces): their folders."""
        folder = Path(self.folder(key)) / PIECES
        if not folder.is_dir():
            return {}
        return {p.name: p for p in sorted(folder.iterdir()) if p.is_dir()}

    def parts(self, key: str) -> list[str]:
        """The parts present under `key` (a part is present once its .h5 is in place)."""
        if self.copy is not None:
            return self.copy.parts(key)
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


def add_settings(store: Store, key: str, settings: dict) -> None:
    """Record what `key` stands for, once (atomic: concurrent runs write the same file)."""
    mark(store)
    path = Path(store.settings(key))
    if read_json_object(path) != settings:  # missing, or damaged: what `key` stands for is known
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json(path, settings)


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
