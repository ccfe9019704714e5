"""A job's local copy of the part of an object store it works on: fetched before the step, laid
out as a store folder, so that the steps read and write it as they do any store; what the step
added, changed or removed there is sent back (`push`).

Only what lies within `scope` is fetched and sent back: the shard step's and merge's scope is
their settings key's folder without the kept pieces, each part's values (its .h5) fetched only
when the step opens it; an embed job's is its shard's pieces. A scope's folders are listed, or,
where the settings key has an index of its keys (esmshard.store.key_index), not: the step then
looks up the parts the index or the plan names, one by one.
Manifests go before the files they describe (a part counts once its .h5 is there), parts only
where their key is free (a part is written once), and a temporary file never leaves the job.
"""

import logging
import os
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Callable

from ..files import TEMPORARY_NAME
from .location import Location
from .objects import Bucket, Listed, ObjectStore, ObjectStoreError
from .store import COMPILED

NODE_LOCAL = (COMPILED, ".locks")  # compiled layers and locks belong to one node
WHOLE = ""  # the scope of everything under the location

log = logging.getLogger(__name__)


class Mirror:
    """The files of `where` within `scope` (a relative path: folders end in '/') copied to `root`;
    those that `lazy` names (a part's values) only when a step opens them (`fetch`). Unless
    `listed` (or what it says of the bucket), the scope's folders are not listed: a file is
    looked up as a step opens it."""

    def __init__(
        self, where: ObjectStore, root, scope: tuple[str, ...], lazy=lambda r: False, listed=True
    ):
        self.where, self.root, self.scope, self.lazy = where, Path(root), scope, lazy
        self.bucket = Bucket(where)
        self.listed_folders = listed(self.bucket) if callable(listed) else listed
        self.listed: dict[str, Listed] = {}  # relative path: size and ETag, within the scope
        self.fetched: dict[str, tuple[int, int]] = {}  # relative path: (size, mtime_ns) here
        self.downloads = 0  # objects fetched (the others in `fetched` were sent from here)

    def within(self, relative: str) -> bool:
        if relative.split("/")[0] in NODE_LOCAL or TEMPORARY_NAME.match(Path(relative).name):
            return False
        return any(
            s == WHOLE or relative == s or (s.endswith("/") and relative.startswith(s))
            for s in self.scope
        )

    def pull(self, skip: Callable[[str], bool] = lambda relative: False) -> int:
        """List the objects within the scope (its folders alone, not the whole store, and those
        only where `listed`) and fetch them, but those `skip` names and the lazy ones; returns
        how many were fetched."""
        for scope in self.scope:
            if scope == WHOLE or scope.endswith("/"):
                found = self.bucket.entries(scope) if self.listed_folders else {}
            elif scope in self.listed:  # in a folder listed already
                continue
            else:
                head = self.bucket.head(scope)
                found = {} if head is None else {scope: head}
            self.listed.update({r: n for r, n in found.items() if self.within(r) and not skip(r)})
        for relative in sorted(self.listed):
            if not self.lazy(relative):
                self.fetch(relative)
        return self.downloads

    def look_up(self, relatives: list[str]) -> set[str]:
        """Those of `relatives` (within the scope) that are in the object store, each looked up
        once and listed from then on."""
        asked = [r for r in relatives if r not in self.listed and self.within(r)]
        with ThreadPoolExecutor(16) as pool:
            for relative, found in zip(asked, pool.map(self.bucket.head, asked)):
                if found is not None:
                    self.listed[relative] = found
        return {r for r in relatives if r in self.listed}

    def fetch(self, relative: str) -> None:
        """Fetch one object, once: a listed one, or, where the folders were not listed, one
        that is there (one missing, or fetched already: nothing)."""
        if not self.listed_folders:
            self.look_up([relative])
        if relative in self.fetched or relative not in self.listed:
            return
        path = self.root / relative
        self.bucket.download(relative, path)
        self.downloads += 1
        modified = self.listed[relative].modified  # the object's time, as the server keeps it
        os.utime(path, (modified, modified))
        stat = path.stat()
        self.fetched[relative] = (stat.st_size, stat.st_mtime_ns)
        if self.lazy(relative):
            log.info("fetched %s/%s (%d bytes): it holds sequences of this run",
                     self.where.url.rstrip("/"), relative, stat.st_size)  # fmt: skip

    def etag(self, relative: str) -> str | None:
        """The ETag of the object at `relative` as the scope was listed (None: made here)."""
        found = self.listed.get(relative)
        return found.etag if found else None

    def parts(self, key: str) -> list[str]:
        """The parts under settings key `key`: listed in the object store, or made here, and
        not set aside here."""
        names = {r for r in self.listed if self.fetched.get(r) is None or (self.root / r).exists()}
        names |= {p.relative_to(self.root).as_posix() for p in (self.root / key).glob("*.h5")}
        return sorted(
            Path(r).stem
            for r in names
            if r.startswith(f"{key}/") and r.count("/") == 1 and r.endswith(".h5")
            and not Path(r).name.startswith(".")
        )  # fmt: skip

    def moved_line(self) -> str:
        """What the copy cost the object store: the files fetched, and the bytes (an index's
        nodes, read through the same bucket, included)."""
        retried = self.bucket.retried
        return (
            f"store copy: {self.downloads} of {len(self.listed)} files fetched, "
            f"{self.bucket.received} bytes"
            + (f"; {retried} requests retried (throttled or dropped)" if retried else "")
        )

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
def mirrored(
    root,
    scope: tuple[str, ...],
    skip: Callable[[str], bool] = lambda r: False,
    lazy: Callable[[str], bool] = lambda r: False,
    where: ObjectStore | None = None,
    listed: bool | Callable[[Bucket], bool] = True,
):
    """The store folder `root`, fetched from the object store `where` (by default the one the
    workflow named for its jobs; the files `lazy` names only when opened; the scope's folders
    listed or not) and sent back after the step (also after a failed one: what it kept is the
    store's); the Mirror, or None where the store is a folder."""
    where = where or Location.of_job().store
    if where is None:
        yield None
        return
    mirror = Mirror(where, root, scope, lazy, listed)
    mirror.pull(skip)
    try:
        yield mirror
    except ObjectStoreError:
        raise
    except BaseException:
        mirror.push()
        raise
    mirror.push()
    log.info(mirror.moved_line())
