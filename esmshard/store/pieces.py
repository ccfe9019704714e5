"""Kept pieces: what a shard's embed job has finished so far, kept in the store while it runs, so
that a job stopped midway (killed, out of memory, at a cluster's time limit, on a lost node) is
resumed by the next job of that shard, which computes only the rest.

    <store>/<key>/.pieces/<shard>/<n>.h5    consecutive batches' results in the shard file's
                                            layout (esmshard.store.shardfile), their failures
                                            included; attributes `shard`, `piece`, `settings`
    <store>/<key>/.pieces/<shard>/<n>.json  its manifest: sha256, size, sequences and residues

A piece counts once its .h5 is in place: its manifest is written first, the piece renamed into
place last, both atomically. A piece that fails its manifest, or is not its shard's (another
shard's, or computed with other settings), is set aside (`.corrupt`, as a part would be) and its
sequences are computed again. Once the shard's part is in place its pieces are removed; pieces
left beside a part (a job killed between the two) go at the next run's clean-up or
`esmshard store --prune`.
"""

import os
import shutil
import time
from pathlib import Path

import h5py

from ..files import abandon, closable, write_json, writer_suffix
from . import (
    PIECES,
    Store,
    manifest_count,
    piece_files,
    piece_manifests,
    piece_problem,
    read_json_object,
    set_aside_file,
)
from .checksums import sha256
from .passes import kept_passes
from .shardfile import Failure, ShardWriter

COPY_ROWS = 1 << 16  # rows copied at a time when a part is made of its pieces


class Kept:
    """What earlier jobs of a shard kept: the pieces, and the sequences they hold (by key)."""

    def __init__(self, paths: list[Path]):
        self.paths = paths
        self.keys: set[str] = set()  # embedded or failed
        self.failures: list[tuple[str, str, str]] = []  # (key, id, reason)
        self.residues = 0  # embedded
        for path in paths:
            with h5py.File(path, "r") as h5:
                self.keys.update(k.decode() for k in h5["sequence_sha256"][:])
                self.residues += int(h5["length"][:].sum())
                failed = h5["failed/sequence_sha256"][:]
                ids = h5["failed/ids"].asstr()[:]
                reasons = h5["failed/reason"].asstr()[:]
                for key, id_, reason in zip(failed, ids, reasons):
                    self.failures.append((key.decode(), id_, reason))
                    self.keys.add(key.decode())


def kept_residues(store: Store, key: str, shards) -> dict[str, int]:
    """The residues that the kept pieces of each of `shards` hold, by their manifests (a damaged
    one counts 0: its piece is computed again), and the masked passes kept within proteins (a
    residue each: esmshard.store.passes)."""
    folders = store.pieces(key)
    return {
        shard: sum(
            manifest_count((read_json_object(m) or {}).get("n_residues"))
            for m in piece_manifests(folders[shard])
        )
        + kept_passes(folders[shard])
        if shard in folders
        else 0
        for shard in shards
    }


class Pieces:
    """The kept pieces of one shard, computed with the settings `key` stands for."""

    def __init__(self, store: Store, key: str, shard: str, on_kept=None):
        self.folder = Path(store.folder(key)) / PIECES / shard  # Store.pieces lists them
        self.key, self.shard = key, shard
        self.on_kept = on_kept  # called once a piece is in place

    def present(self) -> list[Path]:
        """The pieces in place, in the order they were written."""
        return piece_files(self.folder)

    def kept(self) -> Kept:
        """The pieces that pass their check; the others are set aside."""
        good = []
        for piece in self.present():
            reason = piece_problem(piece, self.key, self.shard)
            if reason:
                set_aside_file(str(piece), str(piece.with_suffix(".json")), reason)
            else:
                good.append(piece)
        return Kept(good)

    def remove(self) -> None:
        """Remove the shard's pieces (its part is in place: they are in it)."""
        shutil.rmtree(self.folder, ignore_errors=True)
        try:
            self.folder.parent.rmdir()  # `.pieces/` once no shard has any
        except OSError:
            pass


class PieceWriter:
    """This job's pieces: whole batches appended to the current piece (from one thread at a
    time), which `keep` puts in place; the next batch starts the next piece."""

    def __init__(
        self, pieces: Pieces, after: list[Path], layers, include, dim, attrs: dict, widths=None
    ):
        self.pieces = pieces
        self.layers, self.include, self.dim, self.attrs = layers, include, dim, attrs
        self.widths = widths  # esmshard.store.shardfile.value_width
        self.number = max((int(p.stem) for p in after), default=0)
        self.written: list[Path] = []  # this job's pieces in place
        self.kept_at = time.monotonic()
        self.h5 = self.writer = self.tmp = self.target = None
        self.members: list[int] = []  # the current piece's records (shard positions)
        self.sequences = self.residues = 0  # the current piece's embedded ones

    def add(self, keys, ids, members, reps) -> None:
        """One batch's results: the sequences `members` (their `keys` and `ids`), `reps` for
        those embedded (the rest failed)."""
        if self.h5 is None:
            self.number += 1
            self.pieces.folder.mkdir(parents=True, exist_ok=True)
            self.target = self.pieces.folder / f"{self.number:05d}.h5"
            self.tmp = self.target.with_name(f".{self.target.name}{writer_suffix()}")
            self.h5 = h5py.File(self.tmp, "w", rdcc_nbytes=0)  # esmshard.files.CLOSE_BYTES
            self.writer = ShardWriter(self.h5, self.layers, self.include, self.dim, self.widths)
        if reps:
            self.writer.write(keys, ids, reps)
            self.sequences += len(reps)
            self.residues += sum(next(iter(r.values())).length for r in reps)
        self.members += members

    def due(self, every: float) -> bool:
        """Whether `every` seconds have passed since the last piece was kept (0: never due)."""
        return every > 0 and self.h5 is not None and time.monotonic() - self.kept_at >= every

    def keep(self, failed: list[Failure], keys, ids) -> None:
        """Put the current piece in place, with the failures of its sequences (on an error, as a
        full disk, the caller discards it)."""
        self.kept_at = time.monotonic()
        if self.h5 is None:
            return
        members = set(self.members)
        failed = [f for f in failed if f.index in members]
        self.writer.write_failed(failed, keys, ids)
        self.h5.attrs.update(shard=self.pieces.shard, piece=self.number, **self.attrs)
        closable(self.h5, self.tmp)
        self.h5.close()
        write_json(
            self.target.with_suffix(".json"),
            {
                "sha256": sha256(self.tmp),
                "bytes": os.path.getsize(self.tmp),
                "n_sequences": self.sequences,
                "n_residues": self.residues,
                "n_failed": len(failed),  # kept too: their jobs do not try them again
            },
        )
        os.replace(self.tmp, self.target)
        self.written.append(self.target)
        self.h5 = self.writer = self.tmp = self.target = None
        self.members, self.sequences, self.residues = [], 0, 0
        if self.pieces.on_kept:
            self.pieces.on_kept()

    def discard(self) -> None:
        """Drop the current piece unkept (it could not be kept: a full disk)."""
        if self.h5 is not None:
            abandon(self.h5, self.tmp)
        elif self.tmp is not None:  # its file made, not opened: a disk already full
            Path(self.tmp).unlink(missing_ok=True)
        self.h5 = self.writer = self.tmp = self.target = None


def assemble(part, pieces: list[Path], layers, include, dim, widths=None) -> ShardWriter:
    """Write the pieces' rows, in order, into the open shard file `part`; its failures are the
    caller's to write."""
    writer = ShardWriter(part, layers, include, dim, widths)
    names = []
    part.visititems(
        lambda name, obj: names.append(name) if isinstance(obj, h5py.Dataset) else None
    )
    for path in pieces:
        with h5py.File(path, "r") as h5:
            for name in names:
                source, target = h5[name], part[name]
                for start in range(0, len(source), COPY_ROWS):
                    ShardWriter._append(target, source[start : start + COPY_ROWS])
    return writer
