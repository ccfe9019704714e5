"""Stop an export at a signal between two blocks (its temporary output is then removed),
and draw its progress, where a stop that a finalizer swallowed is acted on.
"""

import signal
import sys
import time
from contextlib import contextmanager


class Stop:
    """The signals that stopped an export (`stoppable`): the first one's name and number."""

    def __init__(self):
        self.signals: list[int] = []

    @property
    def signal(self) -> signal.Signals:
        return signal.Signals(self.signals[0] if self.signals else signal.SIGINT)  # else Ctrl-C


_watching: Stop | None = None  # the `stoppable` block's, for the progress bar to act on


@contextmanager
def stoppable(stop: Stop):
    """Ctrl-C, SIGTERM and a closed terminal (SIGHUP) stop the export inside the block as
    KeyboardInterrupt, recorded in `stop`: at once, or at the next block of proteins where the
    signal lands in a finalizer (h5py frees its objects in weakref callbacks, where Python
    prints the exception and drops it)."""
    global _watching

    def stopped(signum, frame):
        stop.signals.append(signum)
        raise KeyboardInterrupt

    shown_unraisable = sys.unraisablehook

    def unraisablehook(unraisable):
        if not isinstance(unraisable.exc_value, KeyboardInterrupt):  # raised again, below
            shown_unraisable(unraisable)

    signals = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    previous = {signum: signal.signal(signum, stopped) for signum in signals}
    sys.unraisablehook, _watching = unraisablehook, stop
    try:
        yield
    finally:
        sys.unraisablehook, _watching = shown_unraisable, None
        for signum, handler in previous.items():
            signal.signal(signum, handler)


class ProgressBar:
    """Proteins written so far, on one line of stderr (a line per 10% when it is no terminal);
    a stop that a finalizer swallowed ends the export at the next block (`stoppable`)."""

    def __init__(self, total: int, label: str, stream=sys.stderr):
        self.total, self.label, self.stream = total, label, stream
        self.done, self.started, self.shown = 0, time.monotonic(), -1
        self.terminal = stream.isatty()

    def update(self, n: int) -> None:
        if _watching is not None and _watching.signals:
            raise KeyboardInterrupt
        self.done += n
        percent = 100 * self.done // max(1, self.total)
        if self.terminal or percent // 10 > self.shown // 10 or self.done == self.total:
            end = "\r" if self.terminal and self.done < self.total else "\n"
            rate = self.done / max(1e-9, time.monotonic() - self.started)
            self.stream.write(
                f"{self.label}: {self.done:,}/{self.total:,} proteins ({percent}%), "
                f"{rate:,.0f}/s{end}"
            )
            self.stream.flush()
            self.shown = percent
