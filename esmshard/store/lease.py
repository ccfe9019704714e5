"""One run at a time in an outdir in object storage: a lease, where a folder has its run lock
(esmshard.store.runlock), which an object store cannot hold.

The lease is one object (`<outdir>/.esmshard/run.lease`) that names its holder as the run lock
does (host, process, start, command, run id). It is made only where no object is there
(`If-None-Match: *`), renewed by its holder every RENEW_SECONDS, and replaced or removed only
where its ETag is still the one its writer read (`If-Match`): of two drivers that race for it,
one wins. A lease whose holder is gone is taken over: at once where the holder ran on this host
(its process is gone), else once it has not been renewed for EXPIRES_SECONDS, measured by the
server's clock (its `Last-Modified` against its `Date`), so that no two hosts' clocks are
compared.
"""

import json
import logging
import socket
import threading
from email.utils import parsedate_to_datetime

from .objects import Bucket, ObjectStoreError
from .runlock import RunActiveError, describe, new_run, process_alive

log = logging.getLogger(__name__)

RENEW_SECONDS = 15
EXPIRES_SECONDS = 60


class Lease:
    """The lease of the outdir `outdir` (its URL, as the user finds it) at `relative` in
    `bucket`; `take` it, and it is renewed until `release`."""

    def __init__(self, bucket: Bucket, relative: str, outdir: str,
                 renew: float = RENEW_SECONDS, expires: float = EXPIRES_SECONDS):  # fmt: skip
        self.bucket, self.relative, self.outdir = bucket, relative, outdir
        self.renew, self.expires = renew, expires
        self.etag: str | None = None  # of the lease this process holds
        self.record: dict = {}
        self.stopped = threading.Event()
        self.writing = threading.Lock()  # a renewal and the release, one at a time

    def holder(self) -> "tuple[dict, str, float] | None":
        """Who holds the lease, its ETag, and the seconds since it was last renewed (the
        server's); None where there is no lease."""
        found = self.bucket.get(self.relative)
        if found is None:
            return None
        try:
            record = json.loads(found["Body"].read())
        except ValueError:
            record = {}
        now = parsedate_to_datetime(found["ResponseMetadata"]["HTTPHeaders"]["date"])
        return record, found["ETag"], (now - found["LastModified"]).total_seconds()

    def problem(self) -> str | None:
        """The line that refuses this run while another holds the lease; None where it is free,
        or its holder gone."""
        found = self.holder()
        if found is None or self.gone(found[0], found[2]):
            return None
        return self.active_line(found[0], found[2])

    def gone(self, record: dict, age: float) -> bool:
        """Whether the lease's holder is gone: its process on this host, or its renewals."""
        here = record.get("host") == socket.gethostname() and isinstance(record.get("pid"), int)
        return (here and not process_alive(record["pid"])) or age > self.expires

    def active_line(self, record: dict, age: float) -> str:
        return (
            f"another esmshard run is active in {self.outdir}: {describe(record)} (its lease "
            f"{self.bucket.where.url.rstrip('/')}/{self.relative}, renewed {age:.0f} s ago). Two "
            "runs in one outdir would redo and delete each other's work: wait for that run to "
            f"finish (or stop it), or give this one another outdir. (A lease not renewed for "
            f"{self.expires:.0f} s is taken over by the next run.)"
        )

    def take(self, say=log.info) -> dict:
        """Take the lease for this process (taking over one whose holder is gone, which `say`
        tells) and renew it until `release`; the run's record (run id, who). Raises
        RunActiveError where another run holds it."""
        self.record = new_run()
        body = json.dumps(self.record).encode()
        etag = self.bucket.put(self.relative, body, only_new=True)
        if etag is None:
            found = self.holder()
            if found is not None and not self.gone(found[0], found[2]):
                raise RunActiveError(self.active_line(found[0], found[2]))
            if found is not None:
                etag = self.bucket.put(self.relative, body, if_match=found[1])
                say(f"esmshard: took over the lease of a run that is gone: {describe(found[0])}")
            else:  # released between the two requests
                etag = self.bucket.put(self.relative, body, only_new=True)
            if etag is None:
                raise RunActiveError(
                    f"another esmshard run took the lease of {self.outdir} at this moment: "
                    "wait for it to finish, or give this run another outdir"
                )
        self.etag = etag
        threading.Thread(target=self._renewing, daemon=True, name="esmshard-lease").start()
        return self.record

    def _renewing(self) -> None:
        body = json.dumps(self.record).encode()
        while not self.stopped.wait(self.renew):
            with self.writing:
                if self.etag is None:  # released
                    return
                try:
                    etag = self.bucket.put(self.relative, body, if_match=self.etag)
                except ObjectStoreError as err:  # a server that stops: again at the next turn
                    log.warning("esmshard: cannot renew the lease of %s: %s", self.outdir, err)
                    continue
                if etag is None:
                    log.warning(
                        "esmshard: the lease of %s was taken over by another run, which may "
                        "redo this run's work", self.outdir,
                    )  # fmt: skip
                self.etag = etag

    def release(self) -> None:
        """Stop renewing and remove the lease, where it is still this process's."""
        self.stopped.set()
        with self.writing:
            if self.etag is not None:
                try:
                    self.bucket.delete(self.relative, if_match=self.etag)
                except ObjectStoreError as err:
                    log.warning("esmshard: cannot remove the lease of %s: %s", self.outdir, err)
                self.etag = None
