import os
import signal
import subprocess
import sys

import pytest
from conftest import run_lock_holder as holder

from esmshard.store import runlock


def test_a_second_run_is_refused_naming_the_first(tmp_path):
    lock = tmp_path / ".esmshard" / "run.lock"
    first = holder(lock)
    try:
        with pytest.raises(runlock.RunActiveError) as refused:
            runlock.hold(lock, "results")
        message = str(refused.value)
        assert (
            f"another esmshard run is active in results: the run of process {first.pid} on host {os.uname().nodename}"
            in message
        )
        assert f"in {os.getcwd()}: -c. " in message  # where, and its command line (python -c)
    finally:
        first.kill()
        first.wait()


def test_a_killed_run_never_blocks_the_next(tmp_path):
    lock = tmp_path / "run.lock"
    first = holder(lock)
    os.kill(first.pid, signal.SIGKILL)
    first.wait()
    assert lock.exists()  # left behind, and harmless
    check = subprocess.run(
        [sys.executable, "-c", f"from esmshard.store import runlock; runlock.hold({str(lock)!r}, 'results')"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert check.returncode == 0, check.stderr
