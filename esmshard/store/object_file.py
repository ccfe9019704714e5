"""One object of an object store read as a file, by ranged GETs: HDF5 (h5py) opens it and
reads only the blocks that hold what it is asked for, so that one protein of a run in a bucket
costs a few requests, not the run's bytes.
"""

import io
import os
from collections import OrderedDict
from functools import lru_cache
from urllib.parse import urlparse

from .location import reaching
from .objects import Bucket, Listed, ObjectStore

BLOCK = 1 << 16  # bytes a GET fetches at least: HDF5's small metadata reads share one
CACHED_BLOCKS = 256  # blocks kept (16 MiB): HDF5 returns to its superblock and B-trees


class ObjectFile(io.RawIOBase):
    """The object `relative` of `bucket`, read-only and seekable; `size` and `etag` as the
    server gave them when it was opened; `requests` and `fetched` count what it cost."""

    def __init__(self, bucket: Bucket, relative: str, found: Listed):
        super().__init__()
        self.bucket, self.relative = bucket, relative
        self.size, self.etag = found.size, found.etag
        self.position = 0
        self.blocks: OrderedDict[int, bytes] = OrderedDict()
        self.requests = self.fetched = 0

    @property
    def name(self) -> str:
        return f"{self.bucket.where.url.rstrip('/')}/{self.relative}"

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.position, io.SEEK_END: self.size}[whence]
        self.position = max(0, base + offset)
        return self.position

    def readinto(self, buffer) -> int:
        view = memoryview(buffer).cast("B")
        stop = min(self.position + len(view), self.size)
        if stop <= self.position:
            return 0
        first, last = self.position // BLOCK, (stop - 1) // BLOCK
        self._fetch([b for b in range(first, last + 1) if b not in self.blocks])
        done = 0
        for block in range(first, last + 1):
            data = self.blocks[block]
            self.blocks.move_to_end(block)
            low = max(self.position, block * BLOCK) - block * BLOCK
            high = min(stop, (block + 1) * BLOCK) - block * BLOCK
            view[done : done + high - low] = data[low:high]
            done += high - low
        self.position = stop
        while len(self.blocks) > max(CACHED_BLOCKS, last - first + 1):
            self.blocks.popitem(last=False)
        return done

    def _fetch(self, missing: list[int]) -> None:
        """Fetch the blocks `missing`, each run of neighbours by one GET."""
        runs = []
        for block in missing:
            if runs and runs[-1][1] == block:
                runs[-1][1] = block + 1
            else:
                runs.append([block, block + 1])
        for low, high in runs:
            start, stop = low * BLOCK, min(high * BLOCK, self.size)
            data = self.bucket.read_range(self.relative, start, stop)
            self.requests += 1
            self.fetched += len(data)
            for block in range(low, high):
                self.blocks[block] = data[(block - low) * BLOCK : (block - low + 1) * BLOCK]


def object_file(url: str) -> ObjectFile:
    """The object at `url` (s3://bucket/key), open for ranged reads; FileNotFoundError where
    there is none."""
    where = reaching(url)
    boto_env = tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith("AWS_")))
    bucket = _bucket(f"{urlparse(url).scheme}://{where.bucket}", where.endpoint_url, boto_env)
    found = bucket.head(where.prefix)
    if found is None:
        raise FileNotFoundError(f"{url} is not in the object store")
    return ObjectFile(bucket, where.prefix, found)


@lru_cache(maxsize=8)
def _bucket(root: str, endpoint_url: str | None, boto_env: tuple) -> Bucket:
    """One client a bucket: making one takes a tenth of a second. `boto_env` (the AWS_
    variables) is part of the key: boto3 finds the server and keys there when it is made."""
    return Bucket(ObjectStore(root, endpoint_url))
