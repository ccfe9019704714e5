"""run_step, which every job script runs: how a job ended is always in its log."""

import subprocess
import sys


def job(log, body: str, *args):
    script = (
        "import sys, time\n"
        "from esmshard.steps.job import run_step\n"
        f"def step():\n    {body}\n"
        f"run_step({str(log)!r}, step)\n"
    )
    return subprocess.Popen(
        [sys.executable, "-c", script, *args], stderr=subprocess.PIPE, text=True
    )


def test_an_unexpected_error_is_in_the_log_with_its_traceback(tmp_path):
    failed = job(tmp_path / "job.log", "{}['missing key']")
    assert failed.wait() == 1
    log = (tmp_path / "job.log").read_text()
    assert "step: unexpected error (please report it with this log)" in log
    assert "Traceback" in log and log.rstrip().endswith("KeyError: 'missing key'")


def test_concurrent_attempts_add_to_one_log(tmp_path):
    log = tmp_path / "job.log"
    first, second = (job(log, "time.sleep(0.5)") for _ in range(2))
    assert first.wait() == second.wait() == 0
    text = log.read_text()
    assert text.count("step: started on") == 2 and text.count("step: done") == 2
    # Every attempt is kept beside it too: Snakemake removes a job's log before a rerun.
    assert (tmp_path / "attempts" / "job.log").read_text() == text
    for proc in (first, second):
        assert f"process {proc.pid}" in text


def test_ctrl_c_as_the_job_says_it_started_ends_it_in_one_line(tmp_path):
    # The moment `esmshard run`'s test waits for before its Ctrl-C: the signal lands while the
    # "started" line is written, before the step is imported.
    script = (
        "import logging, os, signal\n"
        "from esmshard.steps.job import run_step\n"
        "class CtrlC(logging.Filter):\n"
        "    def filter(self, record):\n"
        "        if 'started' in record.getMessage():\n"
        "            os.kill(os.getpid(), signal.SIGINT)\n"
        "        return True\n"
        "logging.getLogger('esmshard').addFilter(CtrlC())\n"
        f"run_step({str(tmp_path / 'job.log')!r}, 'esmshard.steps.embed:run_shard')\n"
    )
    stopped = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert stopped.returncode == 130 and "Traceback" not in stopped.stderr, stopped.stderr
    assert stopped.stderr.rstrip().endswith(
        "run_shard: stopped by SIGINT (Ctrl-C); what it finished is kept, its incomplete "
        "outputs are removed"
    )
    assert "Traceback" not in (tmp_path / "job.log").read_text()
