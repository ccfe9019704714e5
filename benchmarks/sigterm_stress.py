"""SIGTERM to an `esmshard run`'s process group at random moments: every run must end within
30 s, and the same command must then go on until the run finishes.

    python benchmarks/sigterm_stress.py --tries 20 --seed 1

One folder, one command (`esmshard run` of every `--every`-th E. coli protein with `--model` and
`keep_every=1`, in a session of its own, as a terminal or a scheduler would start it). Each try
starts the command, waits a random time (uniform, 0 to `--within` seconds) and sends SIGTERM to
its process group (the command, its guard, Snakemake and the jobs: each process gets the signal
once from the group, and the guard passes it on once). A try fails if the command has not ended
30 s later; a process of the run left behind fails it too. After the tries the command runs to
the end. Prints a JSON line per try and a summary; exits non-zero if any try failed.
"""

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from esmshard.input.datasets import shared_data_dir, write_every_nth_record

LIMIT_SECONDS = 30


def processes_naming(folder: Path) -> list[int]:
    """The processes whose command line names `folder` (the run's, its jobs')."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            if str(folder).encode() in (proc / "cmdline").read_bytes():
                found.append(int(proc.name))
        except OSError:
            continue
    return found


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tries", type=int, default=20)
    parser.add_argument("--within", type=float, default=15.0, help="seconds after the start")
    parser.add_argument("--every", type=int, default=1)
    parser.add_argument("--model", default="random:esm2_t6_8M_UR50D")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    esmshard = str(Path(sys.executable).parent / "esmshard")
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        fasta = folder / "proteins.fasta"
        write_every_nth_record(shared_data_dir() / "ecoli_k12_UP000000625.fasta", fasta,
                               args.every)  # fmt: skip
        out = folder / "out"
        command = [esmshard, "run", str(fasta), "-o", str(out), "--model", args.model,
                   "--config", "keep_every=1"]  # fmt: skip
        for attempt in range(1, args.tries + 1):
            run = subprocess.Popen(command, cwd=folder, stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
            moment = rng.uniform(0, args.within)
            time.sleep(moment)
            finished = run.poll() is not None
            if not finished:
                os.killpg(run.pid, signal.SIGTERM)
            sent = time.monotonic()
            try:
                status = run.wait(timeout=LIMIT_SECONDS)
                ended = time.monotonic() - sent
            except subprocess.TimeoutExpired:
                status, ended = None, None
            time.sleep(1)
            left = processes_naming(out)
            ok = status is not None and not left
            failures += not ok
            print(json.dumps({
                "try": attempt, "signal_after_seconds": round(moment, 2),
                "finished_before_the_signal": finished, "exit_status": status,
                "ended_after_seconds": ended, "processes_left": len(left), "ok": ok,
            }), flush=True)  # fmt: skip
            for pid in left:  # so that the next try starts clean
                os.kill(pid, signal.SIGKILL)
            if finished:
                break
        started = time.monotonic()
        last = subprocess.run(command, cwd=folder, capture_output=True, text=True)
        whole = last.returncode == 0 and (out / "embeddings.h5").is_file()
        print(json.dumps({
            "tries": attempt, "failed_tries": failures, "last_run_status": last.returncode,
            "last_run_seconds": round(time.monotonic() - started, 1), "finished": whole,
        }), flush=True)  # fmt: skip
    return 0 if failures == 0 and whole else 1


if __name__ == "__main__":
    sys.exit(main())
