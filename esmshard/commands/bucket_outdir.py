"""A run's outdir in object storage as `esmshard status` reads it: its small files (the plan,
the jobs' metrics and progress, logs, run.json) fetched into a temporary folder laid out as the
outdir, with the times the server gave them; its large files (embeddings.h5, the store's parts)
stand there as empty files of the same times, for a reader that asks only whether they are
there and since when. The store's kept pieces are read through their manifests alone.
"""

import json
import os
from contextlib import contextmanager
from pathlib import Path
from tempfile import TemporaryDirectory

from ..layout import Layout
from ..store import PIECES
from ..store.location import reaching
from ..store.mirror import WHOLE, Mirror
from ..store.objects import ObjectStore

SMALL = 1 << 20  # bytes: a larger object stands as an empty file


@contextmanager
def outdir_in_bucket(url: str, endpoint_url: str | None = None):
    """The outdir at `url` as a temporary folder (see above), its plan pointing at the store's
    copy there; `endpoint_url`: the server (else the one boto3 finds)."""
    url = url.rstrip("/")
    with TemporaryDirectory(prefix="esmshard-outdir-") as tmp:
        root = Path(tmp) / "out"
        copy(url, root, endpoint_url)
        plan_json = Path(Layout(str(root)).plan_json)
        if plan_json.is_file():
            plan = json.loads(plan_json.read_text())
            store = str(plan.get("store", ""))
            if store.startswith(f"{url}/"):
                local = root / store[len(url) + 1 :]
            else:  # a store of its own elsewhere: its settings key's folder
                local = Path(tmp) / "store"
                key_url = f"{store.rstrip('/')}/{plan['key']}"
                copy(key_url, local / plan["key"], endpoint_url, store=True)
            plan_json.write_text(json.dumps({**plan, "store": str(local)}))
        yield root


def copy(url: str, root: Path, endpoint_url: str | None, store: bool = False) -> None:
    """The objects under `url` (an outdir, or with `store` a store's folder) in `root`: the
    small ones fetched, the others standing as empty files, as do the store's files but its
    kept pieces' manifests; each with the server's time."""
    where = ObjectStore(url, endpoint_url) if endpoint_url else reaching(url)
    mirror = Mirror(where, root, (WHOLE,))
    mirror.lazy = lambda relative: standing_in(relative, mirror.listed[relative].size, store)
    mirror.pull()
    for relative, listed in mirror.listed.items():
        path = root / relative
        if relative not in mirror.fetched:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.touch()
            os.utime(path, (listed.modified, listed.modified))


def standing_in(relative: str, size: int, store: bool) -> bool:
    """Whether the object at `relative` stands as an empty file rather than being fetched."""
    in_store = store or relative.startswith("store/")
    piece_manifest = f"/{PIECES}/" in f"/{relative}" and relative.endswith(".json")
    return size > SMALL or relative.endswith(".h5") or (in_store and not piece_manifest)
