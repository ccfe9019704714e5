"""A killed embed job loses at most `keep_every` seconds: the next job of its shard computes only
what was not kept (esmshard.store.pieces), and the result equals an uninterrupted run's."""

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

from conftest import REPO, SLICE, assert_same_values, every_value, fasta, snakemake_command

from esmshard.layout import Layout, every_attempt

RECORDS = SLICE[:120]  # ~37k residues: seconds of esm2_t6 on the CPU, many batches
SETTINGS = ["model=random:esm2_t6_8M_UR50D", "include=[mean,per_tok]", "shards=1"]
SETTINGS += ["toks_per_batch=2048", "keep_every=1"]


def command(tmp_path: Path, outdir: str):
    cmd, env = snakemake_command(tmp_path / "work", {})
    cmd += ["--config", f"input={tmp_path / 'proteins.fasta'}", f"outdir={outdir}", *SETTINGS]
    return cmd, env


def kept_sequences(outdir: Path) -> int:
    """The sequences the store's pieces hold now, by their manifests."""
    found = (outdir / "store").glob("*/.pieces/*/*.json")
    return sum(json.loads(p.read_text())["n_sequences"] for p in found)


def progress(outdir: Path) -> dict:
    try:
        (path,) = (outdir / "progress").glob("*.json")
        return json.loads(path.read_text())
    except (ValueError, OSError):
        return {}


def kill_job_at(cmd, env, outdir: Path, share: float, sig: signal.Signals) -> None:
    """Run the command, and send `sig` to the embed job alone once it has done `share` of its
    residues and kept a piece; wait for the run to end."""
    run = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)  # fmt: skip
    deadline = time.time() + 300
    while True:
        found = progress(outdir)
        done = found.get("residues_done", 0) >= share * found.get("n_residues", float("inf"))
        if done and kept_sequences(outdir):
            break
        assert run.poll() is None and time.time() < deadline, "the job ended before its kill"
        time.sleep(0.02)
    os.kill(found["pid"], sig)
    assert run.wait(timeout=120) != 0


def test_a_killed_shard_resumes_computing_only_what_was_not_kept(tmp_path):
    fasta(tmp_path / "proteins.fasta", RECORDS)
    cmd, env = command(tmp_path, str(tmp_path / "whole"))
    subprocess.run(cmd, cwd=REPO, env=env, check=True, capture_output=True)

    outdir = tmp_path / "killed"
    cmd, env = command(tmp_path, str(outdir))
    kept_before = []
    for share, sig in ((0.25, signal.SIGKILL), (0.5, signal.SIGTERM), (0.75, signal.SIGINT)):
        kill_job_at(cmd, env, outdir, share, sig)
        kept_before.append(kept_sequences(outdir))
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]

    # Each job after the first started from what the ones before it kept, and computed the rest.
    (log,) = Path(Layout(str(outdir)).log("embed", "x")).parent.glob("*.log")
    lines = re.findall(r"(\d+) sequences kept by an earlier job \(\d+ pieces\), (\d+) to compute",
                       Path(every_attempt(str(log))).read_text())  # fmt: skip
    counts = [(int(kept), int(todo)) for kept, todo in lines]
    assert counts == [(k, len(RECORDS) - k) for k in kept_before]
    assert 0 < kept_before[0] < kept_before[1] < kept_before[2] < len(RECORDS)
    (metrics,) = (outdir / "metrics").glob("*.json")
    assert json.loads(metrics.read_text())["kept_sequences"] == kept_before[-1]
    # the pieces are in the part now; the result is the uninterrupted run's, bit for bit
    assert not list((outdir / "store").glob("*/.pieces"))
    whole = every_value(tmp_path / "whole" / "embeddings.h5")
    assert_same_values(whole, every_value(outdir / "embeddings.h5"))
