"""The embed job's writing behind its compute (esmshard.steps.writing_behind.WritingBehind)."""

import signal
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from esmshard.steps.writing_behind import WritingBehind


class SlowPieceWriter:
    """A PieceWriter's calls, with an add that takes a while (a large batch on a slow disk)."""

    def __init__(self):
        self.added: list[str] = []
        self.kept: list[list[str]] = []  # what each kept piece held

    def add(self, keys, ids, members, reps):
        time.sleep(1)  # far longer than the signal takes to come
        self.added += keys

    def keep(self, failed, keys, ids):
        self.kept.append(list(self.added))


def test_a_signal_while_a_batch_is_written_keeps_that_batch_in_the_piece():
    """The job's handler keeps the open piece: it must wait for the add still going on, or the
    piece's manifest undercounts what its file then holds (the resumed job and the manifest
    disagree on what was kept)."""

    def stop(signum, frame):
        raise KeyboardInterrupt

    writer = SlowPieceWriter()
    before = signal.signal(signal.SIGALRM, stop)
    try:
        with ThreadPoolExecutor(1) as background:
            behind = WritingBehind(writer, background)
            behind.add(["first"], ["P1"], [0], [object()])
            signal.setitimer(signal.ITIMER_REAL, 0.1)  # while the next add waits for it
            with pytest.raises(KeyboardInterrupt):
                behind.add(["second"], ["P2"], [1], [object()])
            behind.keep([], ["first", "second"], ["P1", "P2"])  # as the job's handler does
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, before)
    assert writer.kept == [["first"]]
    assert behind.write_seconds >= 1 and not behind.pending
