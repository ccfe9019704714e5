"""A run whose jobs share no filesystem (Snakemake's `--default-storage-provider s3`): where its
store is in object storage, and the checks said before any job (docs/clusters.md, "Cloud").
"""

import csv
import io
import json
import os
import posixpath
from typing import NamedTuple

from ..layout import Layout
from ..store.objects import Bucket, ObjectStore, ObjectStoreError, check_writable, is_object_url
from .invocation import Invocation, StartRefused

NEEDS_PROVIDER = (
    "run with --default-storage-provider s3 --default-storage-prefix s3://BUCKET/PREFIX "
    "--shared-fs-usage none (docs/clusters.md)"
)


def run_object_store(invocation: Invocation, config: dict) -> ObjectStore | None:
    """The store's location in object storage for a run whose files are there, None for a run
    on a filesystem; raises StartRefused for a combination that cannot work."""
    provider, store = invocation.storage_provider, config["store"]
    if provider is None:
        if store and is_object_url(store):
            raise StartRefused(f"store {store} is in object storage: {NEEDS_PROVIDER}")
        return None
    if provider != "s3":
        raise StartRefused(
            f"--default-storage-provider {provider}: esmshard keeps its store through the S3 "
            "protocol alone for now (AWS S3 and S3-compatible servers: MinIO, Ceph, Google Cloud "
            "Storage's interoperability endpoint); use s3"
        )
    unseen = "a folder of this machine, which jobs that share no filesystem cannot see"
    if os.path.isabs(str(config["outdir"])):
        raise StartRefused(
            f"outdir {config['outdir']} is {unseen}: give a path relative to "
            "--default-storage-prefix"
        )
    if store and not is_object_url(store):
        raise StartRefused(
            f"store {store} is {unseen}: give an s3:// URL, or leave it unset for a store "
            "under the run's outdir"
        )
    if config["output_values"] == "in_place":
        raise StartRefused(
            "output_values: in_place reads the store's parts where they lie, which jobs that "
            "share no filesystem cannot: set output_values: copy"
        )
    prefix = (invocation.storage_prefix or "").rstrip("/")
    url = store or f"{prefix}/{posixpath.normpath(config['outdir'])}/store"
    return ObjectStore(url, invocation.storage_endpoint)


class ObjectRunCheck(NamedTuple):
    problems: list[str]  # one line each: what stops the run before any job
    input_bytes: dict[str, int]  # the inputs' sizes, by path (for the steps' memory)


def check_object_run(
    store: ObjectStore, prefix: str, inputs: list[str], writes: bool = True
) -> ObjectRunCheck:
    """The inputs' sizes, and what stops a run before any job: the run's prefix and the store
    unreachable or (`writes`) not writable, an input that is not there; the first failure of
    the server stands for the rest."""
    run = ObjectStore(prefix, store.endpoint_url)
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


def run_bucket(prefix: str, store: ObjectStore) -> Bucket:
    """The bucket under the run's `prefix`, on `store`'s server."""
    return Bucket(ObjectStore(prefix, store.endpoint_url))


def planned_in_object_store(prefix: str, store: ObjectStore, layout: Layout) -> list[str]:
    """The shards that the shard step of `layout`'s run planned, read from the object store."""
    text = run_bucket(prefix, store).read(posixpath.normpath(layout.plan))
    return [row["shard"] for row in csv.DictReader(io.StringIO(text.decode()), delimiter="\t")]


def read_run_json(prefix: str, store: ObjectStore, layout: Layout) -> dict | None:
    """The run's run.json in the object store, or None where it cannot be read (the run's
    last lines are then left out: the run itself said what went wrong)."""
    try:
        found = run_bucket(prefix, store).read(layout.run_json)
        return json.loads(found)
    except (ObjectStoreError, ValueError):
        return None
