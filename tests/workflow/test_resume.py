"""A killed embed job loses at most `keep_every` seconds: the next job of its shard computes only
what was not kept (esmshard.store.pieces), and the result equals an uninterrupted run's."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from helpers import (
    MODEL,
    REPO,
    SLICE,
    assert_same_values,
    every_value,
    fasta,
    progress_of,
    snakemake_command,
)

from esmshard.compute.embedder import SLOW_BATCHES_ENV
from esmshard.layout import Layout, every_attempt
from esmshard.steps import run_state
from esmshard.steps.progress import PROGRESS_LINE_ENV
from esmshard.store import piece_files

RECORDS = SLICE[:120]  # ~37k residues: many batches
# the micro model: what is kept and resumed is tested here, not the arithmetic; the jobs that
# are killed are slowed (SLOW_BATCHES_ENV) to be caught computing, whatever this machine
SETTINGS = [f"model={MODEL}", "include=[mean,per_tok]", "shards=1"]
SETTINGS += ["toks_per_batch=2048", "keep_every=1"]


def command(tmp_path: Path, outdir: str):
    cmd, env = snakemake_command(tmp_path / "work", {})
    cmd += ["--config", f"input={tmp_path / 'proteins.fasta'}", f"outdir={outdir}", *SETTINGS]
    return cmd, env


def esmshard(env, *args) -> str:
    done = subprocess.run(["esmshard", *args], env=env, capture_output=True, text=True)
    return done.stdout + done.stderr


def kept_pieces(outdir: Path) -> list[Path]:
    """The store's pieces in place now, each shard's in the order they were written."""
    return [p for f in sorted((outdir / "store").glob("*/.pieces/*")) for p in piece_files(f)]


def kept_sequences(outdir: Path) -> int:
    """The sequences the store's pieces in place hold now, by their manifests."""
    found = kept_pieces(outdir)
    return sum(json.loads(p.with_suffix(".json").read_text())["n_sequences"] for p in found)


RESUMING = re.compile(
    r"esmshard: resuming: 0 of 1 shards finished, [\d,]+ of [\d,]+ residues done \([\d,]+ "
    r"kept from stopped jobs\); computing the rest"
)


def kill_job_at(cmd, env, outdir: Path, share: float, sig: signal.Signals, pieces=1) -> str:
    """Run the command, its batches slowed, and send `sig` to the embed job alone once it has
    done `share` of its residues and kept `pieces` pieces; wait for the run to end; return what
    it printed."""
    said = outdir.parent / f"said-{share}.txt"
    slow = {**env, SLOW_BATCHES_ENV: "0.2"}
    with open(said, "w") as stderr:
        run = subprocess.Popen(cmd, cwd=REPO, env=slow, stdout=subprocess.DEVNULL, stderr=stderr)
    deadline = time.time() + 300
    while True:
        found = progress_of(outdir)
        done = found.get("residues_done", 0) >= share * found.get("n_residues", float("inf"))
        if done and len(kept_pieces(outdir)) >= pieces:
            break
        assert run.poll() is None and time.time() < deadline, "the job ended before its kill"
        time.sleep(0.02)
    os.kill(found["pid"], sig)
    assert run.wait(timeout=120) != 0
    # the job itself gone too: it keeps its last piece as it stops
    deadline = time.time() + 60
    while time.time() < deadline:
        try:
            os.kill(found["pid"], 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    return said.read_text()


@pytest.fixture(scope="module")
def whole(tmp_path_factory) -> dict:
    """An uninterrupted run's values."""
    tmp_path = tmp_path_factory.mktemp("whole")
    fasta(tmp_path / "proteins.fasta", RECORDS)
    cmd, env = command(tmp_path, str(tmp_path / "whole"))
    subprocess.run(cmd, cwd=REPO, env=env, check=True, capture_output=True)
    return every_value(tmp_path / "whole" / "embeddings.h5")


def test_a_killed_shard_resumes_computing_only_what_was_not_kept(tmp_path, whole):
    fasta(tmp_path / "proteins.fasta", RECORDS)

    outdir = tmp_path / "killed"
    cmd, env = command(tmp_path, str(outdir))
    kept_before = []
    for share, sig in ((0.25, signal.SIGKILL), (0.5, signal.SIGTERM), (0.75, signal.SIGINT)):
        said = kill_job_at(cmd, env, outdir, share, sig, pieces=2)
        if sig == signal.SIGKILL:  # killed between a piece's manifest and putting it in place
            kept_pieces(outdir)[-1].unlink()  # one shard: its last piece
        kept_before.append(kept_sequences(outdir))
        if sig != signal.SIGKILL:  # stopped, not crashed: the last line says what is kept
            last = said.strip().splitlines()[-1]
            assert re.fullmatch(
                r"esmshard: stopped; 0 of 1 shards finished, [\d,]+ of [\d,]+ "
                r"residues done \([\d,]+ kept from stopped jobs\): the same "
                r"command finishes the run: snakemake .+",
                last,
            ), last
        if share > 0.25:  # each command after a stop says what it found kept, before its jobs
            assert RESUMING.search(said), said[-2000:]
        if sig == signal.SIGKILL:  # what people read while the run is down: kept work counts
            said = esmshard(env, "status", str(outdir))
            assert re.search(r"residues [\d,]+/[\d,]+  \([\d,]+ kept from stopped jobs\)", said)
            assert re.search(
                r"no job running: [\d,]+ residues kept from stopped jobs, [\d,]+ "
                r"left; the run's same command computes the rest",
                said,
            ), said
            said = esmshard(env, "store", str(outdir / "store"))
            assert f"{kept_before[-1]} sequences kept by interrupted jobs in" in said, said
            said = esmshard(env, "store", str(outdir / "store"), "--verify")
            assert re.search(r"0 parts and \d+ kept pieces checked, 0 damaged", said), said
    # every batch's progress line, where plain snakemake says every 30 s
    done = subprocess.run(cmd, cwd=REPO, env={**env, PROGRESS_LINE_ENV: "0"}, capture_output=True,
                          text=True)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert RESUMING.search(done.stderr)
    # plain snakemake shows no job's progress: the job (of the one shard) says its own
    said = re.findall(r"^esmshard: shard \S+: ([\d,]+)/([\d,]+) residues \((\d+)%\), \S+ "
                      r"residues/s, ETA (\d+m\d\ds)$", done.stderr, re.M)  # fmt: skip
    assert len(said) >= 2 and said[-1][2] == "100" and said[-1][3] == "0m00s", done.stderr[-2000:]

    # Each job after the first started from what the ones before it kept, and computed the rest.
    (log,) = Path(Layout(str(outdir)).log("embed", "x")).parent.glob("*.log")
    lines = re.findall(r"(\d+) sequences kept by an earlier job \(\d+ pieces\), (\d+) to compute",
                       Path(every_attempt(str(log))).read_text())  # fmt: skip
    counts = [(int(kept), int(todo)) for kept, todo in lines]
    assert counts == [(k, len(RECORDS) - k) for k in kept_before]
    assert 0 < kept_before[0] < kept_before[1] < kept_before[2] < len(RECORDS)
    (metrics,) = (outdir / "metrics").glob("*.json")
    metrics = json.loads(metrics.read_text())
    assert metrics["kept_sequences"] == kept_before[-1] and metrics["kept_residues"] > 0
    assert int(said[0][0].replace(",", "")) > metrics["kept_residues"]  # kept, then a batch
    # the report counts the kept residues as done, and times only what the last job computed
    layout = Layout(str(outdir))
    scaling = json.loads(Path(layout.scaling_json).read_text())
    assert scaling["n_residues_kept"] == metrics["kept_residues"]
    computed = metrics["n_residues"] - metrics["kept_residues"]
    assert scaling["shards"][0]["residues_per_second"] == computed / metrics["compute_seconds"]
    page = Path(layout.scaling_html).read_text()
    assert f"({metrics['kept_residues']:,} kept by stopped jobs, computed before)" in page
    # the shard's row: its residues, of them kept, and the rate of the rest (a reader divides)
    assert "<th>of them kept by stopped jobs</th>" in page
    assert scaling["shards"][0]["n_residues_kept"] == metrics["kept_residues"]
    assert f"<td>{metrics['n_residues']:,}</td><td>{metrics['kept_residues']:,}</td>" in page
    # one truth about the work: the last line, run.json, `esmshard status` and the report
    run = json.loads(Path(layout.run_json).read_text())
    kept = kept_before[-1]
    assert run["kept_from_stopped_jobs"] == metrics["kept_sequences"] == kept
    assert run["computed_by_this_command"] == run["computed"] - kept > 0
    said = f"{run['computed']} computed ({run['computed'] - kept} by this command, {kept} kept"
    said += f" from stopped jobs: {metrics['kept_residues']:,} residues)"
    assert said in done.stderr, done.stderr[-2000:]
    state = run_state.read_state(outdir)
    assert state["residues_kept"] == metrics["kept_residues"]
    assert state["residues_computed"] == computed
    assert state["residues_per_second"] == pytest.approx(computed / metrics["compute_seconds"])
    assert scaling["residues_per_second"] == pytest.approx(state["residues_per_second"])
    # the pieces are in the part now; the result is the uninterrupted run's, bit for bit
    assert not list((outdir / "store").glob("*/.pieces"))
    assert_same_values(whole, every_value(outdir / "embeddings.h5"))


def test_a_damaged_piece_is_set_aside_and_its_sequences_computed_again(tmp_path, whole):
    fasta(tmp_path / "proteins.fasta", RECORDS)
    outdir = tmp_path / "out"
    cmd, env = command(tmp_path, str(outdir))
    kill_job_at(cmd, env, outdir, 0.5, signal.SIGTERM)
    # what a planned shard kept stays through a prune that keeps the outdir
    pruned = esmshard(env, "store", str(outdir / "store"), "--prune", "--keep", str(outdir))
    assert ".pieces" not in pruned and "0 files" in pruned
    first = kept_pieces(outdir)[0]
    lost = json.loads(first.with_suffix(".json").read_text())["n_sequences"]
    kept = kept_sequences(outdir)
    with open(first, "r+b") as fh:  # 16 bytes changed, the size kept
        fh.seek(first.stat().st_size // 2)
        fh.write(bytes(16))
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    (log,) = (outdir / "logs" / "embed").glob("*.log")
    text = log.read_text()
    assert f"store part {first} fails its check (sha256 " in text
    assert f"{kept - lost} sequences kept by an earlier job" in text
    # The damaged piece's sequences went into batches with others than before (the batching
    # tolerance: docs/performance.md), the kept ones are bit for bit the same.
    found = every_value(outdir / "embeddings.h5")
    assert found["ids"] == whole["ids"]
    for name in ("mean", 6), ("per_tok", 6):
        assert np.allclose(found[name], whole[name], rtol=0, atol=1e-5), name
    # a job killed after its part was in place, before it removed its pieces (and the run before
    # its merge): the next run's start removes them, the part holds them
    leftover = first.parent
    leftover.mkdir(parents=True)
    (leftover / "00001.h5").write_bytes(b"kept before the part")
    (outdir / "embeddings.h5").unlink()
    again = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    assert again.returncode == 0 and not leftover.exists()


def test_a_killed_masked_marginal_shard_loses_no_more_than_an_embedding_shard(tmp_path):
    """A batch of masked marginals holds a token budget of masked copies, not of proteins, so
    that it takes about as long as an embedding batch and pieces are kept as often; what a kill
    leaves is resumed, and the result is the uninterrupted run's, bit for bit."""
    from esmshard.compute.batching import make_batches

    records = [r for r in SLICE if len(r[1]) <= 120][:40]
    lengths = [len(s) for _, s in records]
    fasta(tmp_path / "proteins.fasta", records)
    masked = ["include=[masked_marginals,pll]", "toks_per_batch=30000"]  # keep_every=1: SETTINGS
    uninterrupted, env = command(tmp_path, str(tmp_path / "whole"))
    subprocess.run([*uninterrupted, *masked], cwd=REPO, env=env, check=True, capture_output=True)
    (metrics,) = (tmp_path / "whole" / "metrics").glob("*.json")
    metrics = json.loads(metrics.read_text())
    batches = make_batches(lengths, 30000, packed=True, masked=True)
    assert metrics["n_batches"] == len(batches) > 10
    # the report counts every pass's tokens: a protein of L residues, L + 1 passes of L + 2
    passes = sum((n + 2) * (n + 1) for n in lengths)
    scaling = json.loads(Path(Layout(str(tmp_path / "whole")).scaling_json).read_text())
    assert metrics["forward_tokens"] == scaling["forward_tokens"] == passes
    page = Path(Layout(str(tmp_path / "whole")).scaling_html).read_text()
    assert "forward-pass tokens of the finished jobs over their time" in page
    assert len(make_batches(lengths, 30000, packed=True)) == 1  # embeddings: one batch

    outdir = tmp_path / "killed"
    cmd, env = command(tmp_path, str(outdir))
    kill_job_at([*cmd, *masked], env, outdir, 0.4, signal.SIGKILL)
    kept = kept_sequences(outdir)
    done = subprocess.run([*cmd, *masked], cwd=REPO, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    (log,) = (outdir / "logs" / "embed").glob("*.log")
    assert f"{kept} sequences kept by an earlier job" in log.read_text()
    assert 0 < kept < len(records)
    assert_same_values(
        every_value(tmp_path / "whole" / "embeddings.h5"), every_value(outdir / "embeddings.h5")
    )


def test_a_run_stopped_with_ctrl_c_counts_its_time_slot_and_residues_kept(tmp_path):
    """`esmshard run` stopped with Ctrl-C a third of the way, then `esmshard status` and the
    same command, as a user types them: the stopped job's time is the run's elapsed time and the
    report's, its slot shows what it kept, and the last line counts what it kept in residues,
    the progress's unit, beside the sequences."""
    fasta(tmp_path / "proteins.fasta", RECORDS)
    esmshard_bin = Path(sys.executable).parent / "esmshard"
    typed = [str(esmshard_bin), "run", "proteins.fasta", "-o", "out", "--model", MODEL,
             "--config", *SETTINGS[1:]]  # fmt: skip
    slow = {**os.environ, SLOW_BATCHES_ENV: "0.2"}
    run = subprocess.Popen(typed, cwd=tmp_path, env=slow, stderr=subprocess.PIPE, text=True,
                           start_new_session=True,
                           preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # fmt: skip
    outdir = tmp_path / "out"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        found = progress_of(outdir)
        if found.get("residues_done", 0) > found.get("n_residues", 1) / 3 and kept_pieces(outdir):
            break
        assert run.poll() is None, run.communicate()[1]
        time.sleep(0.05)
    os.killpg(run.pid, signal.SIGINT)
    assert run.wait(timeout=120) == 130
    shown = subprocess.run([str(esmshard_bin), "status", "out"], cwd=tmp_path,
                           capture_output=True, text=True).stdout  # fmt: skip
    assert "no shard yet" not in shown and "(stopped at " in shown and "%, kept)" in shown, shown
    elapsed = re.search(r"elapsed (\d+)m(\d\d)s", shown)
    assert elapsed and 60 * int(elapsed[1]) + int(elapsed[2]) >= 2, shown

    again = subprocess.run(typed, cwd=tmp_path, capture_output=True, text=True)
    assert again.returncode == 0, again.stderr[-3000:]
    (summary,) = [line for line in again.stderr.splitlines() if " computed (" in line]
    counted = re.search(r"(\d+) kept from stopped jobs: ([\d,]+) residues\)", summary)
    scaling = json.loads(Path(Layout(str(outdir)).scaling_json).read_text())
    (metrics,) = (outdir / "metrics").glob("*.json")
    metrics = json.loads(metrics.read_text())
    assert counted and int(counted[1]) == metrics["kept_sequences"], summary
    assert int(counted[2].replace(",", "")) == metrics["kept_residues"], summary
    (first,) = metrics["stopped_jobs"]
    stopped_for = first["stopped_at"] - first["computing_since"]
    assert scaling["stopped_jobs"] == 1 and stopped_for >= 2
    assert scaling["jobs_seconds"] >= stopped_for + 0.9 * metrics["compute_seconds"]
    assert not list((outdir / "progress" / "stopped").glob("*.json"))  # the metrics hold it
