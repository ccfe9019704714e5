"""A store's parts: their manifests, their checks, and setting aside a part that fails one."""

import base64
import json
import logging
import os
import tempfile
from pathlib import Path

import h5py
import numpy as np

from ..files import Buckets, write_json
from .checksums import file_checksums, sha256
from .key_index import ENTRY, Held
from .keys import KEY_BYTES, KEY_DTYPE, keys_of, settings_key
from .store import Store

log = logging.getLogger(__name__)


def write_manifest(path, part_file, n_sequences: int) -> None:
    """The manifest of a part about to be renamed into place from `part_file`: its size and
    sha256, and the keys of the sequences it holds (so that a run learns what a part of an
    object store holds without fetching its values)."""
    write_json(
        path,
        {
            "sha256": sha256(part_file),
            "bytes": os.path.getsize(part_file),
            "n_sequences": n_sequences,
            "keys": base64.b64encode(part_keys(part_file).tobytes()).decode("ascii"),
        },
    )


def part_keys(path) -> np.ndarray:
    """The keys of the sequences that a part holds embeddings of (its failures excluded)."""
    with h5py.File(path, "r") as h5:
        return keys_of(h5["sequence_sha256"][:])


def stored_keys(store: Store, key: str, name: str) -> np.ndarray:
    """The keys of part `name`'s sequences: from its manifest, or, where that names none (a part
    written before manifests did), from the part itself."""
    try:
        listed = json.loads(Path(store.manifest(key, name)).read_text()).get("keys")
        if isinstance(listed, str):
            return np.frombuffer(base64.b64decode(listed, validate=True), dtype=KEY_DTYPE)
    except (OSError, ValueError, AttributeError):
        pass  # no readable manifest: the part says, or fails its check
    return part_keys(store.local(store.part(key, name)))


def index_parts(store: Store, key: str, names: list[str], every: bool = False) -> None:
    """Add the sequences of parts `names` (from their manifests) to the index of `key` in the
    object store of a job's copy, spread first over files by the keys' first byte, so that each
    of the index's nodes is written about once however many parts there are; `every`: these are
    every whole part of the key, and the index then says it holds them all."""
    with tempfile.TemporaryDirectory(prefix="esmshard-index-") as spill:
        spread = Buckets([os.path.join(spill, str(b)) for b in range(256)])
        for code, name in enumerate(names):
            keys = stored_keys(store, key, name)
            entries = np.empty(keys.size, ENTRY)
            entries["key"], entries["part"] = keys, code
            spread.scatter(keys.view(np.uint8).reshape(-1, KEY_BYTES)[:, 0], entries)
        spread.flush()
        by_byte = (np.fromfile(p, ENTRY) for p in spread.paths if os.path.exists(p))
        add_to_index(store, key, ((e["key"], e["part"]) for e in by_byte), names, every)


def add_to_index(store: Store, key: str, batches, names: list[str], every: bool) -> None:
    """Add to the index of `key` each batch of (sequence keys, their parts' numbers in `names`),
    a batch a share of the keys by their first byte; `every`: see index_parts."""
    index, indexed = store.key_index(key), set()
    for keys, codes in batches:
        index.add(Held(keys, codes.astype(np.uint32), names))
        indexed.update(np.unique(codes).tolist())
    if every:
        index.mark()
    log.info("%d parts' sequences indexed in %s (%d index nodes written)", len(indexed),
             store.shown(store.folder(key)), index.nodes_written)  # fmt: skip


def part_problem(store: Store, key: str, name: str) -> str | None:
    """None if the part is the one its name says: shard `name`, computed with the settings `key`
    stands for (a part copied in from another shard, model or store is not); else what it is."""
    try:
        with h5py.File(store.local(store.part(key, name)), "r") as h5:
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
    part = store.local(store.part(key, name))
    return check_file(part, store.manifest(key, name), checksum_cache) or part_problem(
        store, key, name
    )


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
    part = store.part(key, name)
    return set_aside_file(part, store.manifest(key, name), reason, store.shown)


def set_aside_file(part, manifest, reason: str, shown=lambda path: path) -> list[str]:
    """`set_aside` for a file of a part's layout (a part, a kept piece) and its manifest, named
    in the log as `shown` names them."""
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
        shown(part),
        reason,
        kept or "set aside as " + (" and ".join(map(shown, moved)) or "(already gone)"),
    )
    return moved


def manifest_count(value) -> int:
    """A count read from a manifest; a damaged one (missing, null, text) counts 0."""
    return value if isinstance(value, int) and value >= 0 else 0
