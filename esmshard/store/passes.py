"""Kept passes: the masked passes a job has finished within a protein, kept beside its shard's
pieces, so that a job stopped inside a long masked-marginal scan (a titin's 34,350 passes) is
resumed by the next job of its shard at the pass it reached.

    <store>/<key>/.pieces/<shard>/passes-<sequence sha256>.npz    `marginals` (passes × 20) and
                                                                 `own` (passes): each masked
                                                                 residue's log-probabilities

The passes of a protein are in order from its first residue; a file holds whole batches of them,
so that the next job's batches of the rest are an uninterrupted job's and give the same values.
A file is written under a temporary name and renamed into place; one that does not read back
as a protein's passes is computed again. The pieces folder goes, these files with it, once the
shard's part is in place (esmshard.store.pieces).
"""

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import numpy as np

from ..files import atomic_path

log = logging.getLogger(__name__)

PREFIX = "passes-"


class Rows(NamedTuple):
    """A batch of a protein's masked passes: per masked residue, the 20 amino acids'
    log-probabilities and its own residue's (arrays, or torch tensors on the job's device)."""

    marginals: object  # passes × 20, float32
    own: object  # passes, float32

    @classmethod
    def on_host(cls, batches: list["Rows"]) -> "Rows":
        """The batches, in order, as one of host arrays."""
        return cls(*(np.concatenate([_host(r[k]) for r in batches]) for k in range(2)))


def passes_files(folder: Path) -> list[Path]:
    """The kept passes in a shard's pieces folder."""
    return sorted(Path(folder).glob(f"{PREFIX}*.npz")) if Path(folder).is_dir() else []


def kept_passes(folder: Path) -> int:
    """The masked passes kept in a shard's pieces folder (a file that cannot be read counts 0:
    its passes are computed again)."""
    count = 0
    for path in passes_files(folder):
        try:
            with np.load(path) as saved:
                count += len(saved["own"])
        except (OSError, ValueError, KeyError):
            pass
    return count


def read_rows(path: Path, length: int) -> Rows | None:
    """The passes kept at `path` of a protein of `length` residues; None where there are none,
    or the file does not read back as such (its passes are computed again)."""
    try:
        with np.load(path) as saved:
            rows = Rows(saved["marginals"], saved["own"])
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError) as err:
        log.warning("%s: not a protein's kept passes (%s); computing them again", path, err)
        return None
    n = len(rows.own)
    if rows.marginals.shape != (n, 20) or n > length or rows.own.dtype != np.float32:
        log.warning(
            "%s: not the passes of a %d-residue protein; computing them again", path, length
        )
        return None
    return rows


class Passes:
    """The masked passes of a job's proteins: each protein's so far (by its position in the
    shard), kept in `folder` every `every` seconds (never where `folder` is None) and when the
    job stops; `on_passes(index, n)` hears of each batch of n passes."""

    def __init__(
        self,
        folder: Path | None = None,
        keys: list[str] = (),
        every: float = 0,
        on_passes: Callable[[int, int], None] | None = None,
    ):
        self.folder, self.keys, self.every = folder, keys, every
        self.on_passes = on_passes
        self.open: dict[int, list[Rows]] = {}  # unfinished proteins' batches of passes
        self.batch: list[tuple[int, Rows]] = []  # the batch being added, not whole yet
        self.kept: dict[int, int] = {}  # passes kept in the store, by protein
        self.kept_at = time.monotonic()

    def path(self, index: int) -> Path:
        return self.folder / f"{PREFIX}{self.keys[index]}.npz"

    def resume(self, indices, sequences) -> dict[int, int]:
        """The passes that earlier jobs kept of the proteins `indices` (of `sequences`), now
        open here: how many, by protein, of those that have any."""
        found = {}
        for index in indices if self.folder and self.folder.is_dir() else ():
            rows = read_rows(self.path(index), len(sequences[index]))
            if rows is not None and len(rows.own):
                self.open[index], self.kept[index] = [rows], len(rows.own)
                found[index] = len(rows.own)
        return found

    def begin(self, index: int, length: int) -> int:
        """The passes of protein `index` (of `length` residues) already done: kept by an earlier
        job (`resume`), or this job's (an out-of-memory retry, whose unfinished batch is
        dropped)."""
        self.batch = []
        rows = self.open.setdefault(index, [])
        return sum(len(r.own) for r in rows)

    def add(self, index: int, marginals, own) -> None:
        """Protein `index`'s next passes in the batch (torch tensors, left on their device until
        they are kept, or arrays); `batch_done` once the batch is whole."""
        self.batch.append((index, Rows(marginals, own)))

    def batch_done(self) -> None:
        """The batch of passes is whole (each of its proteins' shares added): theirs now, and
        kept if due. Only whole batches count, so that what is kept ends where a batch ends
        and the next job batches the rest as this one would have."""
        for index, rows in self.batch:
            self.open[index].append(rows)
            if self.on_passes is not None:
                self.on_passes(index, len(rows.own))
        self.batch = []
        if self.every > 0 and time.monotonic() - self.kept_at >= self.every:
            self.keep()

    def finish(self, index: int) -> list[Rows]:
        """Protein `index`'s passes, all done, in their batches: no longer open."""
        return self.open.pop(index)

    def keep(self) -> int:
        """Put each open protein's passes in the store; returns how many are kept now."""
        self.kept_at = time.monotonic()
        if self.folder is None:
            return 0
        for index, rows in self.open.items():
            done = sum(len(r.own) for r in rows)
            if done > self.kept.get(index, 0):
                self.folder.mkdir(parents=True, exist_ok=True)
                whole = Rows.on_host(rows)
                with atomic_path(self.path(index)) as tmp, open(tmp, "wb") as fh:
                    np.savez(fh, marginals=whole.marginals, own=whole.own)
                self.open[index], self.kept[index] = [whole], done
        return sum(self.kept.get(index, 0) for index in self.open)


def _host(values):
    """A torch tensor's values on the host; an array as it is."""
    return values.detach().cpu().numpy() if hasattr(values, "detach") else values
