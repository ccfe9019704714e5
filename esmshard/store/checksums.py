"""File checksums, cached by file version: inputs replaced by other content, and store parts that fail their check.

Snakemake re-runs a job when an input is newer than its outputs; a file replaced by a copy with
an older modification time (`cp -p`, `rsync -t`, an archive extracted) slips past that. The
sha256 of each input is a param of the shard rule, so that Snakemake's params trigger catches
new content. It is computed once per file version: a cache keyed by size, mtime, ctime and inode
(a replacement changes ctime or the inode, and neither can be set back) answers with a `stat`.
"""

import hashlib
import json
import os
from pathlib import Path

from ..files import write_json


def _version(path) -> list[int]:
    st = os.stat(path)
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]


def sha256(path) -> str:
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def file_checksums(paths, cache_path) -> list[str]:
    """The sha256 of each file, hashing only the files that changed since the cache saw them."""
    cache_path = Path(cache_path)
    try:
        cache = json.loads(cache_path.read_text())
    except (OSError, ValueError):
        cache = {}
    checksums, changed = [], False
    for path in paths:
        key, version = str(Path(path).resolve()), _version(path)
        entry = cache.get(key)
        if entry is None or entry["version"] != version:
            entry = cache[key] = {"version": version, "sha256": sha256(path)}
            changed = True
        checksums.append(entry["sha256"])
    if changed:
        cache_path.parent.mkdir(parents=True, exist_ok=True)
        write_json(cache_path, cache)
    return checksums
