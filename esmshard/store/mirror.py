"""A job's local copy of the part of an object store it works on: fetched before the step, laid
out as a store folder, so that the steps read and write it as they do any store; what the step
added, changed or removed there is sent back (`push`).

Only what lies within `scope` is fetched and sent back: the shard step's and merge's scope is
their settings key's folder without the kept pieces; an embed job's is its shard's pieces.
Manifests go before the files they describe (a part counts once its .h5 is there), parts only
where their key is free (a part is written once), and a temporary file never leaves the job.
"""

from contextlib import contextmanager
from pathlib import Path
from typing import Callable

from ..files import TEMPORARY_NAME
from .objects import Bucket, ObjectStore, ObjectStoreError
from .store import COMPILED

NODE_LOCAL = (COMPILED, ".locks")  # compiled layers and locks belong to one node


class Mirror:
    """The files of `where` within `scope` (a relative path: folders end in '/') copied to `root`."""

    def __init__(self, where: ObjectStore, root, scope: tuple[str, ...]):
        self.where, self.root, self.scope = where, Path(root), scope
        self.bucket = Bucket(where)
        self.fetched: dict[str, tuple[int, int]] = {}  # relative path: (size, mtime_ns) here

    def within(self, relative: str) -> bool:
        if relative.split("/")[0] in NODE_LOCAL or TEMPORARY_NAME.match(Path(relative).name):
            return False
        return any(
            relative == s or (s.endswith("/") and relative.startswith(s)) for s in self.scope
        )

    def pull(self, skip: Callable[[str], bool] = lambda relative: False) -> int:
        """Fetch every object within the scope (but those `skip` names); returns their count."""
        for relative in sorted(self.bucket.listing()):
            if self.within(relative) and not skip(relative):
                path = self.root / relative
                self.bucket.download(relative, path)
                stat = path.stat()
                self.fetched[relative] = (stat.st_size, stat.st_mtime_ns)
        return len(self.fetched)

    def local_files(self) -> dict[str, tuple[int, int]]:
        found = {}
        for path in self.root.rglob("*"):
            relative = path.relative_to(self.root).as_posix()
            if path.is_file() and self.within(relative):
                stat = path.stat()
                found[relative] = (stat.st_size, stat.st_mtime_ns)
        return found

    def push(self) -> None:
        """Send back what the step added or changed within the scope, manifests first, and
        remove the objects of the files it removed (parts set aside, pieces merged)."""
        here = self.local_files()
        changed = [r for r, stat in here.items() if self.fetched.get(r) != stat]
        for relative in sorted(changed, key=lambda r: (r.endswith(".h5"), r)):
            written = self.bucket.upload(
                self.root / relative, relative, only_new=relative.endswith(".h5")
            )
            if written or not relative.endswith(".h5"):
                self.fetched[relative] = here[relative]
        for relative in [r for r in self.fetched if r not in here]:
            self.bucket.delete(relative)
            del self.fetched[relative]


@contextmanager
def mirrored(root, scope: tuple[str, ...], skip: Callable[[str], bool] = lambda r: False):
    """The store folder `root`, fetched from the object store the workflow named for its jobs
    and sent back after the step (also after a failed one: what it kept is the store's); the
    Mirror, or None where the store is a folder."""
    where = ObjectStore.from_env()
    if where is None:
        yield None
        return
    mirror = Mirror(where, root, scope)
    mirror.pull(skip)
    try:
        yield mirror
    except ObjectStoreError:
        raise
    except BaseException:
        mirror.push()
        raise
    mirror.push()
