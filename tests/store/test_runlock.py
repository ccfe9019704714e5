import os
import signal
import subprocess
import sys
import time

import pytest
from helpers import run_lock_holder as holder

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


@pytest.mark.parametrize("check", ["before the DAG", "at onstart"])
def test_a_run_whose_esmshard_run_is_gone_is_waited_for_while_it_ends(tmp_path, check):
    """`kill -9` of an `esmshard run` group: its Snakemake still holds the lock while its jobs
    end (seconds). The same command waits for it, says so once, and starts; a run whose
    command is alive is refused at once."""
    lock = tmp_path / ".esmshard" / "run.lock"
    launcher = subprocess.Popen([sys.executable, "-c", "pass"])
    launcher.wait()  # a command that is gone
    ending = subprocess.Popen(
        [sys.executable, "-c",
         f"import time; from esmshard.store import runlock; runlock.hold({str(lock)!r}, 'results')\n"
         "print('held', flush=True); time.sleep(3)"],
        stdout=subprocess.PIPE, text=True, env={**os.environ, runlock.LAUNCHER_ENV: str(launcher.pid)},
    )  # fmt: skip
    assert ending.stdout.readline().strip() == "held"
    said, started = [], time.monotonic()
    if check == "at onstart":
        runlock.hold(lock, "results", said.append)
    else:
        assert runlock.active_run_problem(lock, "results", said.append) is None
    assert time.monotonic() - started > 1  # it waited for the run to end (3 s), not refused
    ending.wait(timeout=30)
    assert said == [
        "esmshard: the run stopped in this outdir is still ending; waiting for it to end"
    ]

    if check == "at onstart":
        runlock._held.pop().close()  # this test's own lock, taken above, released
    alive = subprocess.Popen(
        [sys.executable, "-c",
         f"import time; from esmshard.store import runlock; runlock.hold({str(lock)!r}, 'results')\n"
         "print('held', flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE, text=True, env={**os.environ, runlock.LAUNCHER_ENV: str(os.getpid())},
    )  # fmt: skip
    try:
        assert alive.stdout.readline().strip() == "held"
        said.clear()
        problem = runlock.active_run_problem(lock, "results", said.append)
        assert problem.startswith("another esmshard run is active in results") and said == []
    finally:
        alive.kill()
        alive.wait()
