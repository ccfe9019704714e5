"""A run whose jobs share no filesystem (Snakemake's `--default-storage-provider s3`, as
esmshard.store.location decides): the checks said before any job, and the files the workflow reads
from the bucket (docs/clusters.md, "Cloud").
"""

import csv
import io
import json
import posixpath
from typing import NamedTuple

from ..layout import Layout
from ..store.location import Location
from ..store.objects import Bucket, ObjectStore, ObjectStoreError, check_writable


class ObjectRunCheck(NamedTuple):
    problems: list[str]  # one line each: what stops the run before any job
    input_bytes: dict[str, int]  # the inputs' sizes, by path (for the steps' memory)


def check_object_run(location: Location, inputs: list[str], writes: bool = True) -> ObjectRunCheck:
    """The inputs' sizes, and what stops a run in object storage before any job: the run's
    prefix and the store unreachable or (`writes`) not writable, an input that is not there;
    the first failure of the server stands for the rest."""
    store, run = location.store, run_bucket(location).where
    try:
        if writes:
            check_writable(run)
            if store.bucket != run.bucket or not store.prefix.startswith(run.prefix):
                check_writable(store)
        bucket = Bucket(run)
        sizes = {path: bucket.size(posixpath.normpath(path)) for path in inputs}
    except ObjectStoreError as err:
        return ObjectRunCheck([str(err)], {})
    problems = [
        f"input {path} is not in the object store ({run.url}/{path}): upload it there, or give "
        "its path relative to --default-storage-prefix"
        for path, size in sizes.items()
        if size is None
    ]
    return ObjectRunCheck(problems, {p: s for p, s in sizes.items() if s is not None})


def see_new_directories() -> None:
    """Let Snakemake's S3 plugin see a directory that a job on another node made: it remembers
    that a folder's objects are absent once it has looked (0.3.x), so the shard step's folder,
    listed before the step ran, would stay missing after it (snakemake#870)."""
    from snakemake_storage_plugin_s3 import StorageObject

    StorageObject.is_dir = lambda self: any(self.get_subkeys())


def run_bucket(location: Location) -> Bucket:
    """The objects under the run's prefix, on its store's server."""
    return Bucket(ObjectStore(location.prefix, location.store.endpoint_url))


def planned_in_object_store(location: Location, layout: Layout) -> list[str]:
    """The shards that the shard step of `layout`'s run planned, read from the object store."""
    text = run_bucket(location).read(posixpath.normpath(layout.plan))
    return [row["shard"] for row in csv.DictReader(io.StringIO(text.decode()), delimiter="\t")]


def read_run_json(location: Location, layout: Layout) -> dict | None:
    """The run's run.json in the object store, or None where it cannot be read (the run's
    last lines are then left out: the run itself said what went wrong)."""
    try:
        found = run_bucket(location).read(layout.run_json)
        return json.loads(found)
    except (ObjectStoreError, ValueError):
        return None
