"""Where a run's files live: in folders of this machine, or in object storage (S3 and servers
that speak its protocol) for jobs that share no filesystem. Decided here alone: once, when the
workflow is read (`Location.of_run`, from Snakemake's storage options); its jobs find the
decision in their environment (`Location.of_job`). Every step, rule and command asks a
Location, as Snakemake's storage plugins decide once where a file is; a path a command is
given is a URL or a folder by esmshard.files.is_object_url.
"""

import json
import os
import posixpath
from dataclasses import dataclass

from ..files import is_object_url
from .objects import ObjectStore

# Set by the workflow for its jobs: where the store's objects are, and the server's address.
OBJECT_STORE_ENV = "ESMSHARD_OBJECT_STORE"
NEEDS_PROVIDER = (
    "run with --default-storage-provider s3 --default-storage-prefix s3://BUCKET/PREFIX "
    "--shared-fs-usage none (docs/clusters.md)"
)
UNSEEN = "a folder of this machine, which jobs that share no filesystem cannot see"


class LocationRefused(ValueError):
    """A run whose files cannot live where its command and config put them: one line."""


@dataclass(frozen=True)
class Location:
    """Where a run's files are: `store` None, in folders; else in object storage, the store's
    objects at `store` (an esmshard.store.objects.ObjectStore) and the run's under `prefix`."""

    store: ObjectStore | None = None
    prefix: str | None = None

    @property
    def in_objects(self) -> bool:
        return self.store is not None

    def url(self, path: str) -> str:
        """A file of the run (relative to the prefix) as its user finds it: its object's URL."""
        return f"{self.prefix.rstrip('/')}/{path}" if self.in_objects else path

    @classmethod
    def of_run(cls, invocation, config: dict) -> "Location":
        """The run's Location, from its command line (esmshard.steps.invocation.Invocation:
        the storage provider, prefix and endpoint) and config (store, outdir); raises
        LocationRefused for a combination that cannot work."""
        provider, store = invocation.storage_provider, config.get("store")
        if provider is None:
            if store and is_object_url(store):
                raise LocationRefused(f"store {store} is in object storage: {NEEDS_PROVIDER}")
            return cls()
        if provider != "s3":
            raise LocationRefused(
                f"--default-storage-provider {provider}: esmshard keeps its store through the "
                "S3 protocol alone for now (AWS S3 and S3-compatible servers: MinIO, Ceph, "
                "Google Cloud Storage's interoperability endpoint); use s3"
            )
        if os.path.isabs(str(config["outdir"])):
            raise LocationRefused(
                f"outdir {config['outdir']} is {UNSEEN}: give a path relative to "
                "--default-storage-prefix"
            )
        if store and not is_object_url(store):
            raise LocationRefused(
                f"store {store} is {UNSEEN}: give an s3:// URL, or leave it unset for a store "
                "under the run's outdir"
            )
        prefix = (invocation.storage_prefix or "").rstrip("/")
        url = store or f"{prefix}/{posixpath.normpath(config['outdir'])}/store"
        return cls(ObjectStore(url, invocation.storage_endpoint), prefix)

    def hand_to_jobs(self) -> None:
        """Put the decision where the run's jobs find it (Location.of_job): the environment,
        which Snakemake passes on to the jobs it starts, here and on a cluster's nodes."""
        if self.in_objects:
            os.environ[OBJECT_STORE_ENV] = json.dumps(
                {
                    "url": self.store.url,
                    "endpoint_url": self.store.endpoint_url,
                    "prefix": self.prefix,
                }  # fmt: skip
            )

    @classmethod
    def of_job(cls) -> "Location":
        """The Location that the workflow handed its jobs; in folders where it handed none."""
        found = os.environ.get(OBJECT_STORE_ENV)
        if not found:
            return cls()
        handed = json.loads(found)
        return cls(ObjectStore(handed["url"], handed["endpoint_url"]), handed.get("prefix"))


def reaching(url: str) -> ObjectStore:
    """`url` on the server of the run's jobs (Location.of_job) or, elsewhere, the one boto3
    finds (AWS_ENDPOINT_URL_S3, a profile's endpoint_url, or the provider's own)."""
    run = Location.of_job().store
    return ObjectStore(url, run.endpoint_url if run else None)
