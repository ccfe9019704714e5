"""Object storage (S3 and servers that speak its protocol): where the store lives when the jobs
share no filesystem (docs/store.md, "A store in object storage").

Objects are written whole or not at all (a PUT, or a multipart upload's completion), so a key
that exists holds a whole file; a part is put only where its key is free (a conditional write,
`If-None-Match: *`), so two runs never replace each other's objects.
"""

import os
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple
from urllib.parse import urlparse

ATTEMPTS = 6  # a request's tries, the first included: about 30 s of backoff at most
# What a server answers a conditional write whose condition failed, and for no such object.
PRECONDITION_FAILED = ("PreconditionFailed", "412", "ConditionalRequestConflict")
MISSING = ("404", "NoSuchKey", "NotFound")


class ObjectStoreError(OSError):
    """The object store cannot be used: one line naming the URL and what to do."""


@dataclass(frozen=True)
class ObjectStore:
    """An object store location: `url` (s3://bucket/prefix), reached at `endpoint_url` (None:
    the provider's own), with the credentials boto3 finds (environment, ~/.aws, the node's role)."""

    url: str
    endpoint_url: str | None = None

    @property
    def bucket(self) -> str:
        return urlparse(self.url).netloc

    @property
    def prefix(self) -> str:
        return urlparse(self.url).path.strip("/")

    def key(self, relative: str) -> str:
        return "/".join(filter(None, [self.prefix, relative.replace(os.sep, "/")]))

    def client(self):
        import boto3
        from botocore.config import Config

        # Throttling (503 SlowDown) and dropped connections are retried with exponential backoff
        # and jitter (botocore's standard mode); a stopped server fails a job within a minute.
        config = Config(
            connect_timeout=10,
            read_timeout=60,
            retries={"mode": "standard", "max_attempts": ATTEMPTS},
            max_pool_connections=32,  # a job's requests in flight (esmshard.store.key_index)
        )
        # a session of its own: credentials as the environment holds them now
        return boto3.session.Session().client("s3", endpoint_url=self.endpoint_url, config=config)


class Listed(NamedTuple):
    """An object as the server lists it."""

    size: int
    etag: str
    modified: float = 0.0  # seconds since the epoch, as the server keeps it


class Fetched(NamedTuple):
    """An object's bytes and its ETag, as one GET gave them."""

    body: bytes
    etag: str


class Bucket:
    """The objects under one ObjectStore location, read and written by relative key."""

    def __init__(self, where: ObjectStore):
        self.where = where
        self.s3 = where.client()
        self.retried = 0  # requests sent again after a throttling answer or a dropped connection
        self.received = 0  # bytes of the objects read and fetched
        self.s3.meta.events.register("after-call.s3", self._count_retries)

    def _count_retries(self, parsed=None, **_) -> None:
        self.retried += (parsed or {}).get("ResponseMetadata", {}).get("RetryAttempts", 0)

    def listing(self, under: str = "") -> dict[str, int]:
        """Every object under `under` (a relative key prefix): its relative key and size."""
        return {relative: found.size for relative, found in self.entries(under).items()}

    def entries(self, under: str = "") -> dict[str, Listed]:
        """Every object under `under` (a relative key prefix): its relative key, size and ETag."""
        found, root = {}, self.where.key("")
        pages = self.s3.get_paginator("list_objects_v2").paginate(
            Bucket=self.where.bucket, Prefix=self.where.key(under)
        )
        try:
            for page in pages:
                for item in page.get("Contents", []):
                    relative = item["Key"][len(root) :].lstrip("/")
                    found[relative] = Listed(
                        item["Size"], item["ETag"], item["LastModified"].timestamp()
                    )
        except Exception as err:
            raise self.failure(err) from err
        return found

    def size(self, relative: str) -> int | None:
        """The object's size, or None where there is none."""
        found = self.head(relative)
        return None if found is None else found.size

    def head(self, relative: str) -> Listed | None:
        """The object's size and ETag, or None where there is none."""
        found = self._unless(MISSING, self.s3.head_object, relative)
        if found is None:
            return None
        return Listed(found["ContentLength"], found["ETag"], found["LastModified"].timestamp())

    def read_range(self, relative: str, start: int, stop: int) -> bytes:
        """Bytes `start` .. `stop` of the object (one ranged GET)."""
        found = self._calling(
            self.s3.get_object,
            Bucket=self.where.bucket,
            Key=self.where.key(relative),
            Range=f"bytes={start}-{stop - 1}",
        )
        return self._body(found)

    def read(self, relative: str) -> bytes:
        found = self._calling(
            self.s3.get_object, Bucket=self.where.bucket, Key=self.where.key(relative)
        )
        return self._body(found)

    def fetch(self, relative: str) -> Fetched | None:
        """The object's bytes and ETag, or None where there is none."""
        found = self.get(relative)
        return None if found is None else Fetched(self._body(found), found["ETag"])

    def _body(self, found: dict) -> bytes:
        body = found["Body"].read()
        self.received += len(body)
        return body

    def download(self, relative: str, path: Path) -> None:
        """Fetch one object to `path`, under a temporary name first (a stop leaves no half file)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.download")
        self._calling(self.s3.download_file, self.where.bucket, self.where.key(relative), str(tmp))
        self.received += tmp.stat().st_size
        os.replace(tmp, path)

    def upload(self, path: Path, relative: str, only_new: bool = False) -> bool:
        """Put the file `path` at `relative`; with `only_new`, only where no object is there yet
        (False: another writer's object was there first, and stays)."""
        with open(path, "rb") as fh:
            return self.put(relative, fh, only_new=only_new) is not None

    def put(self, relative: str, body, only_new: bool = False, if_match: str | None = None):
        """Put `body` (bytes or a file) at `relative`: with `only_new`, only where no object is
        there yet; with `if_match`, only where the object there has that ETag. The new object's
        ETag, or None where the condition failed (another writer's object stays)."""
        extra = {"IfNoneMatch": "*"} if only_new else {}
        if if_match is not None:
            extra["IfMatch"] = if_match
        found = self._unless(PRECONDITION_FAILED, self.s3.put_object, relative, Body=body, **extra)
        return None if found is None else found["ETag"]

    def get(self, relative: str) -> dict | None:
        """The object's GET response (boto3's: `Body`, `ETag`, `LastModified`, the server's
        `Date` among its headers), or None where there is none."""
        return self._unless(MISSING, self.s3.get_object, relative)

    def delete(self, relative: str, if_match: str | None = None) -> bool:
        """Remove the object (with `if_match`, only where it has that ETag: False otherwise)."""
        extra = {} if if_match is None else {"IfMatch": if_match}
        return (
            self._unless(PRECONDITION_FAILED, self.s3.delete_object, relative, **extra) is not None
        )

    def _unless(self, codes: tuple[str, ...], call, relative: str, **kwargs):
        """`call` on the object at `relative`: its answer, or None where the server answers
        with one of `codes`; any other failure as ObjectStoreError."""
        try:
            return call(Bucket=self.where.bucket, Key=self.where.key(relative), **kwargs)
        except Exception as err:
            if error_code(err) in codes:
                return None
            raise self.failure(err) from err

    def _calling(self, call, *args, **kwargs):
        try:
            return call(*args, **kwargs)
        except Exception as err:
            raise self.failure(err) from err

    def failure(self, err: Exception) -> ObjectStoreError:
        """`err` as one line: the location, what the server said, and what to do."""
        return ObjectStoreError(failure_line(self.where, err))


def error_code(err: Exception) -> str:
    return str(getattr(err, "response", {}).get("Error", {}).get("Code", ""))


def failure_line(where: ObjectStore, err: Exception) -> str:
    """What went wrong reaching `where`, and what to do about it, in one line."""
    from botocore.exceptions import EndpointConnectionError, NoCredentialsError

    server = where.endpoint_url or "the provider's endpoint"
    code = error_code(err)
    if isinstance(err, EndpointConnectionError) or "Could not connect" in str(err):
        return (
            f"{where.url}: cannot reach the object store at {server}: check the address "
            "(--storage-s3-endpoint-url) and that the server is up"
        )
    if isinstance(err, NoCredentialsError):
        return (
            f"{where.url}: no credentials for the object store: set AWS_ACCESS_KEY_ID and "
            "AWS_SECRET_ACCESS_KEY (or --storage-s3-access-key and --storage-s3-secret-key, a "
            "profile in ~/.aws, or the node's role)"
        )
    if code == "NoSuchBucket":
        return f"{where.url}: bucket {where.bucket!r} does not exist at {server}: create it first"
    if code in ("AccessDenied", "403", "InvalidAccessKeyId", "SignatureDoesNotMatch"):
        return (
            f"{where.url}: the object store refused access ({code}): give these credentials "
            f"read and write permission on s3://{where.bucket}/{where.prefix}"
        )
    return f"{where.url}: the object store failed ({code or type(err).__name__}: {err})"


def check_writable(where: ObjectStore) -> None:
    """Write, read back and delete one small object under `where`, so that a run that could not
    keep its results stops before any job; raises ObjectStoreError with one line."""
    bucket = Bucket(where)
    probe = f".esmshard-write-check-{os.getpid()}-{os.urandom(4).hex()}"
    try:
        bucket.s3.put_object(Bucket=where.bucket, Key=where.key(probe), Body=b"esmshard")
        bucket.s3.delete_object(Bucket=where.bucket, Key=where.key(probe))
    except Exception as err:
        raise bucket.failure(err) from err
