"""What `esmshard run` shows while Snakemake runs the workflow: esmshard's own lines, a progress
display read from the run's files (what `esmshard status` knows), and a failed job's one-line
reason with its log; Snakemake's whole output goes to a log file, which the last line names.

On a terminal the progress is one line redrawn in place; elsewhere (a file, a pipe, a cluster
job's output) a line each time a shard finishes, and one every LOG_EVERY_SECONDS between.
"""

import collections
import os
import queue
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from ..layout import Layout
from ..steps.progress import slot_key
from ..steps.run_state import read_state
from ..store.runlock import LAUNCHER_ENV
from . import guard
from .status import progress_line

# esmshard's lines in Snakemake's output: the workflow's ("esmshard: ..."), and a job's
# warnings and errors as its log formats them ("<date> <time> WARNING esmshard: ...").
OURS = re.compile(r"^(?:\S+ \S+ (?P<level>[A-Z]+) )?esmshard(?:\.[\w.]+)?: (?P<message>.*)$")
# A line that a job's log begins an entry with.
STAMPED = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d")
# Snakemake's line naming a failed job's log.
FAILED_LOG = re.compile(r"^\s*log: (?P<path>\S+) \(check log file\(s\) for error details\)")
# What Snakemake says of its profile and config before anything else.
SNAKEMAKE_PREAMBLE = re.compile(r"^(Using workflow specific profile|Config file .* is extended)")
# Snakemake's line where every output is there and up to date: no job runs.
NOTHING_TO_DO = re.compile(r"^Nothing to be done")
# Snakemake's line once it has read the workflow, whose start says what an earlier command of
# the run kept: the progress is drawn after it, not from the last command's state before it.
WORKFLOW_READ = re.compile(r"^Building DAG of jobs")
RUN_LOG = "esmshard-run.log"
UNEXPLAINED_LINES = 20
REFRESH_SECONDS = 1.0
# Without a terminal: a line a minute shows a long shard's ETA without filling the log.
LOG_EVERY_SECONDS = 60.0


def slots_line(state: dict) -> str:
    """The running shards, by pool slot: 'slot 0: 40%  slot 1: 75%'."""
    return "  ".join(
        f"{slot_key(r)}: {100 * r['residues_done'] / max(r['n_residues'], 1):.0f}%"
        for r in sorted(state["running"], key=slot_key)
    )


def job_reason(log_path: str) -> list[str]:
    """A failed job's reason: the last error of its log, with the lines that go on with it."""
    try:
        lines = Path(log_path).read_text(errors="replace").splitlines()
    except OSError:
        return ["see its log"]
    starts = [n for n, line in enumerate(lines) if STAMPED.match(line)]
    matched = {n: OURS.match(lines[n]) for n in starts}
    errors = [n for n, ours in matched.items() if ours and ours["level"] == "ERROR"]
    if not errors:
        return ["see its log"]
    first = errors[-1]
    end = next((n for n in starts if n > first), len(lines))
    return [matched[first]["message"], *lines[first + 1 : end]]


class Console:
    """The user's view of one run, written to `stream`."""

    def __init__(self, outdir: str, stream=sys.stderr, every: float = LOG_EVERY_SECONDS):
        self.outdir, self.stream, self.every = outdir, stream, every
        self.tty = stream.isatty()
        self.drawn = ""  # the progress line on the screen, where one is
        self.shards_done = None
        self.written_at = 0.0  # when the last line was written, without a terminal

    def say(self, text: str) -> None:
        if self.drawn:
            self.stream.write("\r\033[K")
        self.stream.write(text + "\n")
        if self.drawn:
            self.stream.write(self.drawn)
        self.stream.flush()

    def progress(self, final: bool = False) -> None:
        if not os.path.isfile(Layout(self.outdir).plan):
            return
        state = read_state(Path(self.outdir))
        if not state.get("planned"):
            return
        line = "  ".join(filter(None, (progress_line(state), slots_line(state))))
        done = state["shards_done"]
        mutants = state.get("mutants")
        if mutants and mutants.get("planned"):  # pseudo_ppl's and pllr's own run
            done = (done, mutants["shards_done"])
            if state["complete"]:  # the records' run done: the mutants' is what goes on
                line = "mutants: " + "  ".join(
                    filter(None, (progress_line(mutants), slots_line(mutants)))
                )
            else:
                line += f"  mutants: shards {mutants['shards_done']}/{mutants['shards_total']}"
        if self.tty:
            self.drawn = "" if final else line
            self.stream.write("\r\033[K" + line + ("\n" if final else ""))
            self.stream.flush()
        elif done != self.shards_done or (
            not (final or state["complete"]) and time.monotonic() - self.written_at >= self.every
        ):
            self.shards_done, self.written_at = done, time.monotonic()
            self.say(line)


def run_quietly(
    cmd: list[str], env: dict, outdir: str, every: float = LOG_EVERY_SECONDS, stream=sys.stderr
) -> int:
    """Run `cmd` (snakemake) with its output in a log file, showing the user only esmshard's
    lines and the progress (without a terminal, a line `every` seconds); the exit status is
    Snakemake's."""
    console = Console(outdir, stream, every)
    log = tempfile.NamedTemporaryFile("w", prefix="esmshard-run-", suffix=".log", delete=False)
    child = start_guarded(cmd, env)
    lines: queue.Queue = queue.Queue()
    unlogged = []  # why Snakemake's output could not all be logged (a full disk)
    threading.Thread(target=copy_output, args=(child, log, lines, unlogged), daemon=True).start()
    signals = ForwardedSignals(child)
    heard = Heard()
    while not heard.finished:
        heard.follow(lines, console)
        if heard.read:
            console.progress()
    status = child.wait()
    # a command refused as Snakemake reads the workflow ran nothing to show; a stopped one's
    # progress came before its line
    if heard.read and not heard.stop_said:
        console.progress(final=True)
    try:
        log.close()
    except OSError as err:
        unlogged.append(err)
    heard.explain(console, status, signals.interrupted)
    kept = None
    try:
        kept = keep_log(log.name, outdir)
    except OSError as err:
        unlogged.append(err)
    if signals.interrupted and not heard.stop_said:  # the workflow's line says what is kept
        console.say("esmshard run: interrupted; the same command goes on where this one stopped")
    if unlogged:
        why = unlogged[0].strerror or unlogged[0]
        console.say(
            f"esmshard run: Snakemake's output could not all be kept ({why}): what it said of "
            f"each job is in {Path(outdir) / 'logs'}"
        )
    elif kept:
        console.say(f"esmshard run: Snakemake's whole output is in {kept}")
    return 128 + signal.SIGINT if signals.interrupted else status


def start_guarded(cmd: list[str], env: dict) -> subprocess.Popen:
    """Start Snakemake under esmshard.commands.guard, in a session of its own: a signal to this
    command's group (Ctrl-C, a closed terminal, `kill -- -PGID`) reaches it once, through this
    process; and the guard ends it with this process, however that ends."""
    return subprocess.Popen(
        [sys.executable, "-m", guard.__name__, *cmd],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**env, guard.PARENT_ENV: str(os.getpid()), LAUNCHER_ENV: str(os.getpid())},
        bufsize=1,
        start_new_session=True,
    )


def copy_output(child: subprocess.Popen, log, lines: queue.Queue, unlogged: list) -> None:
    """Copy the child's output into `log` and, line by line, into `lines` (None at its end);
    the run goes on where the log cannot be written (its error in `unlogged`)."""
    for line in child.stdout:
        if not unlogged:
            try:
                log.write(line)
            except OSError as err:  # the user is told at the run's end
                unlogged.append(err)
        lines.put(line.rstrip("\n"))
    lines.put(None)


class ForwardedSignals:
    """SIGTERM (a scheduler, kill), SIGINT (Ctrl-C) and SIGHUP (a closed terminal) passed on to
    the guard, which stops Snakemake and its jobs (they keep what they finished); this process
    waits for them to stop. `interrupted`: a Ctrl-C came."""

    def __init__(self, child: subprocess.Popen):
        self.child, self.interrupted = child, False
        for signum in guard.FORWARDED:
            signal.signal(signum, self.forward)

    def forward(self, signum, frame) -> None:
        self.interrupted = self.interrupted or signum == signal.SIGINT
        self.child.send_signal(signum)


class Heard:
    """What Snakemake's output has said so far, and esmshard's lines of it shown."""

    def __init__(self):
        self.failed_logs: list[str] = []
        self.finished = self.said = self.stop_said = self.read = False
        self.last = collections.deque(maxlen=UNEXPLAINED_LINES)  # if it stops unexplained

    def follow(self, lines: queue.Queue, console: "Console") -> None:
        """Hear the lines that come within REFRESH_SECONDS, until the output ends."""
        deadline = time.monotonic() + REFRESH_SECONDS
        try:
            while time.monotonic() < deadline:
                line = lines.get(timeout=max(0.01, deadline - time.monotonic()))
                if line is None:
                    self.finished = True
                    return
                self.hear(line, console)
        except queue.Empty:
            pass

    def hear(self, line: str, console: "Console") -> None:
        """Note one line of Snakemake's output, and show it where it is esmshard's."""
        self.last.append(line)
        failed = FAILED_LOG.match(line)
        if failed:
            self.failed_logs.append(failed["path"])
        self.read = self.read or bool(WORKFLOW_READ.match(line))
        if NOTHING_TO_DO.match(line):
            console.say(
                "esmshard run: nothing to do: every output is there and up to date "
                "(another input, model or setting would run again)"
            )
        ours = OURS.match(line)
        # The workflow's lines and the jobs' warnings; a job's error is said once, at the end.
        if ours and ours["level"] in (None, "WARNING"):
            if ours["message"].startswith("stopped; "):  # the run's last word, last
                self.stop_said = True
                if self.read:
                    console.progress(final=True)
            console.say(f"esmshard: {ours['message']}")
            self.said = True

    def explain(self, console: "Console", status: int, interrupted: bool) -> None:
        """Say why the run failed: each failed job's reason (none after a Ctrl-C), or, where no
        line of ours says why, Snakemake's last lines."""
        for path in dict.fromkeys([] if interrupted else self.failed_logs):
            reason, *more = job_reason(path)
            console.say(f"esmshard run: a job failed (its log: {path}): {reason}")
            for line in more:
                console.say(f"  {line}")
        if status and not (interrupted or self.failed_logs or self.said):
            console.say("esmshard run: Snakemake stopped:")
            for line in self.last:
                if not SNAKEMAKE_PREAMBLE.match(line):
                    console.say(f"  {line}")


def keep_log(temporary: str, outdir: str) -> str | None:
    """Append the run's Snakemake output to outdir/logs/esmshard-run.log, where the run made its
    outdir (a run refused before any job writes nothing there); the path, or None. The
    temporary file goes, whatever happens (OSError: a full disk)."""
    logs = Path(outdir) / "logs"
    try:
        if not logs.is_dir():
            return None
        target = logs / RUN_LOG
        with open(target, "a") as out, open(temporary) as run:
            out.write(f"===== esmshard run, {time.strftime('%Y-%m-%d %H:%M:%S')} =====\n")
            out.write(run.read())
        return str(target)
    finally:
        os.unlink(temporary)
