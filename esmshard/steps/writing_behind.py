"""An embed job's writing behind its compute: each batch's results added to the open piece in a
background thread while the next batch computes.
"""

import time
from concurrent.futures import Future, ThreadPoolExecutor

from ..store.pieces import PieceWriter
from .job import uninterrupted


def timed(fn, *args) -> float:
    """Seconds that fn(*args) took."""
    started = time.perf_counter()
    fn(*args)
    return time.perf_counter() - started


class WritingBehind:
    """Each batch's results added to the open piece in a background thread while the next batch
    computes; a piece is kept once the add before it is done."""

    def __init__(self, writer: PieceWriter, background: ThreadPoolExecutor):
        self.writer, self.background = writer, background
        self.pending: list[Future] = []  # the add still going on, if any
        self.write_seconds = self.keep_seconds = 0.0

    def wait(self) -> None:
        # An add leaves the list once done: a signal that lands while this waits leaves it
        # listed, and the handler's keep() waits for it before the piece is closed and counted.
        while self.pending:
            self.write_seconds += self.pending[0].result()
            self.pending.pop(0)

    def add(self, keys, ids, members, reps) -> None:
        self.wait()
        add = self.background.submit(timed, self.writer.add, keys, ids, members, reps)
        self.pending.append(add)

    def keep(self, failed, keys, ids) -> None:
        self.wait()
        with uninterrupted():
            self.keep_seconds += timed(self.writer.keep, failed, keys, ids)

    def discard(self) -> None:
        """Drop the open piece unkept (a full disk), once no add writes into it."""
        for add in self.pending:
            add.exception()
        self.writer.discard()
