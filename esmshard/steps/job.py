"""How each workflow step runs: its log file, and how it ends (esmshard.steps.job.run_step)."""

import faulthandler
import importlib
import logging
import os
import signal
import socket
import sys
import time
from contextlib import contextmanager

from ..compute.telemetry import peak_memory_mb
from ..layout import every_attempt


def job_logging(log_path) -> logging.Logger:
    """Log to the job's log, this attempt's and (appended) every attempt's, and problems alone
    to the run's output (the job's stderr)."""
    console = logging.StreamHandler(sys.stderr)
    console.setLevel(logging.WARNING)
    attempts = every_attempt(log_path)
    os.makedirs(os.path.dirname(attempts), exist_ok=True)
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        handlers=[logging.FileHandler(path, mode="a") for path in (log_path, attempts)]
        + [console],
    )
    logging.raiseExceptions = False  # a log on a full disk drops lines instead of tracebacks
    return logging.getLogger("esmshard")


def run_step(log_path, step, **kwargs):
    """Run one workflow step with its log file, which records how the step ended, whatever it
    was, and end the job's process.

    `step`: the function, or "module:function", imported here, so that Ctrl-C while torch and
    the rest load ends the job in one line as it does later. Known problems (bad input, a model
    that cannot be had, a full disk) end the step with their message alone; anything else with
    its traceback; a signal with its name.
    """
    from ..files import DiskFullError, quiet_hdf5_cleanup
    from ..input.fasta import FastaError
    from ..models import ModelError
    from ..store.objects import ObjectStoreError
    from .merge import MergeError

    log = job_logging(log_path)
    name = step.rpartition(":")[2] if isinstance(step, str) else step.__name__

    # Cluster walltime and `kill` send SIGTERM: unwind like Ctrl-C, so that what is finished is
    # kept (esmshard.store.pieces), temporary files are removed and the GPU slot's lock is
    # released on the way out.
    def stop(signum, frame):
        if _deferred is not None:  # inside `uninterrupted`: it lands once the block is done
            _deferred.append(signum)
            return
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        log.error(
            "%s: stopped by %s (a time limit, scancel, kill or a closed terminal); what it "
            "finished is kept, its incomplete outputs are removed",
            name,
            signal.Signals(signum).name,
        )
        sys.exit(128 + signum)

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):  # SIGHUP: a closed terminal
        signal.signal(signum, stop)
    started = time.monotonic()
    try:  # from here on, a signal ends the job in one line, however early it comes
        log.info("%s: started on %s, process %d", name, socket.gethostname(), os.getpid())
        # One failure, one line: h5py's noise after a failed write is dropped; the step's own
        # errors are logged below.
        quiet_hdf5_cleanup()
        faulthandler.enable()  # a crash (in a library's C code) names where it happened
        if isinstance(step, str):
            module, _, function = step.partition(":")
            step = getattr(importlib.import_module(module), function)
        step(**kwargs)
    except (
        FastaError,
        ModelError,
        MergeError,
        DiskFullError,
        ObjectStoreError,
        ValueError,
    ) as err:
        log.error("%s", err)
        _exit(1)
    except KeyboardInterrupt:
        log.error(
            "%s: stopped by SIGINT (Ctrl-C); what it finished is kept, its incomplete outputs "
            "are removed",
            name,
        )
        _exit(128 + signal.SIGINT)
    except Exception:
        log.exception("%s: unexpected error (please report it with this log)", name)
        _exit(1)
    log.info(
        "%s: done in %.1f s, peak memory %.0f MB",
        name,
        time.monotonic() - started,
        peak_memory_mb(),
    )
    _exit(0)


def _exit(status: int):
    # Straight out once the log is written, every output being closed by then: after a failed
    # write (a full disk) HDF5's own clean-up at interpreter exit can crash the process and hide
    # the status, and after a good one the interpreter's teardown of torch alone takes 0.5 to 1 s
    # of every job.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


_deferred = None  # inside `uninterrupted`: the signals that arrived meanwhile


@contextmanager
def uninterrupted():
    """A block that SIGTERM and SIGINT do not cut short (a file put in place with its
    manifest): a signal that arrives meanwhile lands when the block is done. Outside a job's
    process (run_step's handlers not installed) signals act as they always do."""
    global _deferred
    if _deferred is not None:  # nested: the outer block delivers
        yield
        return
    _deferred = []
    try:
        yield
    finally:
        arrived, _deferred = _deferred, None
        if arrived:
            signal.raise_signal(arrived[0])
