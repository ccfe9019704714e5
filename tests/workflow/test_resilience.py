"""Nothing lost: kill -9 and resume, corrupt shard files, out-of-memory, awkward real input."""

import csv
import gzip
import json
import os
import re
import signal
import subprocess
import sys
import time

import h5py
import numpy as np
import pytest
from helpers import (
    ALIGNED,
    GENE_CALLER,
    LONG_PROTEIN,
    MODEL,
    NONSTANDARD,
    PROTEINS,
    TINY_MODEL,
    jobs_run,
    kill_9_after_shards,
    planned_parts,
    read_records,
    snakemake,
    snakemake_command,
)

from esmshard.commands import status
from esmshard.steps import run_state

CONFIG = {"input": str(PROTEINS), "model": MODEL, "shards": 6}
IDS = [h[1:].split()[0] for h, _ in read_records(PROTEINS)]


def means(outdir):
    with h5py.File(outdir / "embeddings.h5") as h5:
        return dict(zip(h5["ids"].asstr()[:], h5["mean/6"][:]))


def failed_rows(outdir):
    with open(outdir / "failed_sequences.tsv", newline="") as fh:
        return list(csv.DictReader(fh, delimiter="\t"))


def stamps(paths):
    return {p.name: (p.stat().st_mtime_ns, p.stat().st_ino) for p in paths}


@pytest.fixture(scope="module")
def baseline(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("baseline")  # one shard: the numbers are each record's
    snakemake(workdir, {**CONFIG, "shards": 1}, "--resources", "gpu=1")
    return means(workdir / "results")


def test_kill_9_then_same_command_reruns_only_unfinished_shards(tmp_path, baseline):
    cmd, env = snakemake_command(tmp_path, CONFIG, "--resources", "gpu=1")
    kill_9_after_shards(cmd, env, tmp_path / "results" / "store", 2)
    assert (tmp_path / "results" / ".esmshard" / "run.lock").is_file()  # left by the killed run
    parts = planned_parts(tmp_path / "results")
    finished = [s for s, part in parts.items() if part.exists()]
    shard_files = [parts[s] for s in finished]
    before = stamps(shard_files)
    assert 2 <= len(finished) < 6
    midway = status.render(run_state.read_state(tmp_path / "results"))
    assert (
        f"shards {len(finished)}/6 ({100 * len(finished) / 6:.0f}%)" in midway
        and "finished" not in midway
    )

    again = snakemake(tmp_path, CONFIG, "--resources", "gpu=1")
    assert jobs_run(again)["embed"] == 6 - len(finished)
    assert "shard" not in jobs_run(again)
    assert stamps(shard_files) == before
    done = subprocess.run(
        ["esmshard", "status", str(tmp_path / "results")],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "shards 6/6 (100%)" in done and "finished" in done and "idle" in done
    result = means(tmp_path / "results")
    assert list(result) == IDS
    for name in IDS:
        np.testing.assert_allclose(result[name], baseline[name], atol=1e-5)


def test_corrupt_shard_is_refused_and_rebuilt_alone(tmp_path):
    config = {**CONFIG, "shards": 3}
    snakemake(tmp_path, config)
    first, bad, last = planned_parts(tmp_path / "results").values()
    bad.write_bytes(bad.read_bytes()[: bad.stat().st_size // 2])
    others = stamps([first, last])
    refused = snakemake(tmp_path, config, check=False)
    assert refused.returncode != 0
    shown = f"results/store/{bad.parent.name}/{bad.name}"
    assert f"store part {shown} cannot be merged: unreadable" in refused.stderr
    assert f"set aside ({shown}.corrupt and " in refused.stderr
    assert "run the same command again" in refused.stderr and not bad.exists()

    rebuilt = snakemake(tmp_path, config)  # the same command, nothing done by hand
    assert jobs_run(rebuilt) == {"embed": 1, "merge": 1, "report": 1}
    assert stamps([first, last]) == others
    assert list(means(tmp_path / "results")) == IDS


def test_injected_out_of_memory_halves_batches_and_lists_what_cannot_fit(tmp_path, baseline):
    limit = 1000  # tokens: every multi-sequence batch fails; the 1022-residue ones fail alone
    result = snakemake(tmp_path, {**CONFIG, "shards": 1},
                       env={"ESMSHARD_INJECT_OOM_TOKENS": str(limit)})  # fmt: skip
    outdir = tmp_path / "results"
    logs = "".join(p.read_text() for p in (outdir / "logs" / "embed").glob("*.log"))
    assert "retrying as two halves" in logs
    too_long = {
        h[1:].split()[0] for h, s in read_records(PROTEINS) if min(len(s), 1022) + 2 > limit
    }
    failed = failed_rows(outdir)
    assert {row["id"] for row in failed} == too_long and too_long
    assert all("out of memory even alone" in row["reason"] for row in failed)
    assert all(row["source"].startswith(f"{PROTEINS}:") for row in failed)
    embedded = means(outdir)
    assert list(embedded) == [i for i in IDS if i not in too_long]
    for name, mean in embedded.items():
        np.testing.assert_allclose(mean, baseline[name], atol=1e-5)
    assert (
        f"{len(too_long)} records failed, listed in results/failed_sequences.tsv" in result.stderr
    )


def test_awkward_real_input_every_record_accounted_for(tmp_path):
    """Spaces in paths, shell metacharacters in IDs, gzip + CRLF, gene-caller stops, gaps, U/X, 7096 aa."""
    folder = tmp_path / "my proteins; $(touch pwned)"
    folder.mkdir()
    odd_ids = ['it\'s"quoted"', "$HOME;`touch${IFS}pwned`|x", "../../escape/attempt"]
    ecoli = read_records(PROTEINS)[:3]
    with gzip.open(folder / "odd ids.fa.gz", "wb") as fh:
        fh.write("".join(f">{n} {h[1:]}\r\n{s}\r\n" for n, (h, s) in zip(odd_ids, ecoli)).encode())
    inputs = [folder / "odd ids.fa.gz", GENE_CALLER, ALIGNED, NONSTANDARD, LONG_PROTEIN]
    config = {
        "input": [str(p) for p in inputs],
        "model": MODEL,
        "shards": 3,
        "include": ["mean", "per_tok"],
        "long_sequences": "chunk",
    }
    snakemake(tmp_path / "run dir", config)
    outdir = tmp_path / "run dir" / "results"
    expected = odd_ids + [h[1:].split()[0] for p in inputs[1:] for h, _ in read_records(p)]
    with h5py.File(outdir / "embeddings.h5") as h5:
        assert h5["ids"].asstr()[:].tolist() == expected
        offsets, lengths = h5["per_tok/offsets"][:], h5["lengths"][:]
        assert lengths[-1] == 7096 and offsets[-1] - offsets[-2] == 7096
        long_mean = h5["mean/6"][-1]
        np.testing.assert_allclose(
            long_mean, h5["per_tok/6"][offsets[-2] : offsets[-1]].mean(0), atol=1e-5
        )
    assert failed_rows(outdir) == []
    assert not list(tmp_path.rglob("pwned")) and not (tmp_path / "escape").exists()


@pytest.mark.parametrize("policy", ["skip", "fail"])
def test_long_sequence_policies(tmp_path, policy):
    config = {**CONFIG, "shards": 1, "long_sequences": policy}
    long_ids = [h[1:].split()[0] for h, s in read_records(PROTEINS) if len(s) > 1022]
    result = snakemake(tmp_path, config, check=policy == "skip")
    if policy == "skip":
        failed = failed_rows(tmp_path / "results")
        assert [row["id"] for row in failed] == long_ids
        assert all("skipped (long_sequences: skip)" in row["reason"] for row in failed)
    else:
        assert result.returncode != 0
        assert "long_sequences: fail (3 sequences)" in result.stderr and "> 1022" in result.stderr
        assert all(i in result.stderr for i in long_ids)
        assert not list((tmp_path / "results").rglob("*.h5"))  # nothing computed or stored


def done_residues(progress) -> int:
    try:
        return json.loads(progress.read_text())["residues_done"]
    except (OSError, ValueError, KeyError):
        return 0


def test_sigterm_stops_a_job_promptly_keeping_what_it_finished_and_no_partial_output(tmp_path):
    from esmshard.compute import pool
    from esmshard.input.sizing import ModelSize
    from esmshard.steps.shard import write_shards

    shards = tmp_path / "shards"
    plan = write_shards(
        [PROTEINS],
        shards,
        1,
        1022,
        ModelSize(12 * 6 * 320**2, 320),
        shards / "store",
        {},
        shards / "checksums.json",
    )
    name = plan["shards"][0]["shard"]
    out = tmp_path / f"{name}.h5"
    script = (
        "from esmshard.steps.job import run_step\n"
        "from esmshard.steps.embed import run_shard\n"
        f"run_step({str(tmp_path / 'job.log')!r}, run_shard, shard_tsv={str(shards / f'{name}.tsv')!r},\n"
        f"    out_h5={str(out)!r}, manifest_json={str(tmp_path / 'manifest.json')!r},\n"
        f"    metrics_json={str(tmp_path / 'm.json')!r}, shard={name!r},\n"
        f"    settings=dict(model='random:{TINY_MODEL}', repr_layers=[-1], include=['mean'],\n"
        "        truncation_seq_length=1022, long_sequences='truncate', precision='auto', fast_path=True,\n"
        "        checkpoint='random weights, seed 0'),\n"
        "    toks_per_batch=1100, gpus=[0], threads=1,\n"
        f"    progress_json={str(tmp_path / 'progress.json')!r}, telemetry_tsv={str(tmp_path / 't.tsv')!r},\n"
        f"    outdir={str(tmp_path)!r})\n"
    )
    env = {**os.environ, "ESMSHARD_POOL_DIR": str(tmp_path / "pool")}
    job = subprocess.Popen([sys.executable, "-c", script], env=env)
    deadline = time.time() + 60
    while not done_residues(tmp_path / "progress.json"):  # a batch is finished
        assert job.poll() is None and time.time() < deadline
        time.sleep(0.05)
    job.send_signal(signal.SIGTERM)
    started = time.time()
    assert job.wait(timeout=30) == 128 + signal.SIGTERM
    assert time.time() - started < 30
    assert not out.exists() and not list(tmp_path.glob(f".{name}.h5.*"))
    assert not (tmp_path / "progress.json").exists() and not (tmp_path / "t.tsv").exists()
    log = (tmp_path / "job.log").read_text()
    assert "run_shard: stopped by SIGTERM" in log and "what it finished is kept" in log
    # what it finished, in place for the next job of the shard: whole pieces, nothing half-written
    pieces = tmp_path / ".pieces" / name
    kept = sorted(p.name for p in pieces.iterdir())
    assert kept and all(re.fullmatch(r"\d{5}\.(h5|json)", k) for k in kept), kept
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        ".pieces", "attempts", "job.log", "pool", "shards", "stopped"
    ]  # fmt: skip
    # the job's time and work, for the run's elapsed time and report (beside its progress file)
    (record,) = json.loads((tmp_path / "stopped" / "progress.json").read_text())["jobs"]
    assert record["stopped_at"] > record["computing_since"] and record["residues_computed"] > 0
    with pool.acquire(
        ["0"], tmp_path / "pool" / os.uname().nodename, poll_seconds=0.05, env={}
    ) as slot:
        assert slot.index == 0
