"""Each sequence embedded once: the store, incremental runs and duplicates, through `snakemake`."""

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import pytest
from helpers import (
    COPIES,
    MODEL,
    NEW,
    OTHER_MODEL,
    PROTEINS,
    REPO,
    TINY_MODEL,
    A,
    B,
    config,
    fasta,
    jobs_run,
    kill_9_after_shards,
    kill_9_when,
    leftovers,
    read_records,
    run_json,
    snakemake,
    snakemake_command,
    write_part,
)

from esmshard import store as stores
from esmshard.embeddings_h5.representations import Representation
from esmshard.files import read_tsv


def run(workdir, input_path, outdir, *more):
    return snakemake(workdir, {}, "--resources", "gpu=1", *config(input_path, outdir, *more))


def means(outdir, layer=6):
    with h5py.File(outdir / "embeddings.h5") as h5:
        return dict(zip(h5["ids"].asstr()[:], h5[f"mean/{layer}"][:]))


def planned(outdir):
    return [row["shard"] for row in read_tsv(outdir / "shards" / "plan.tsv")]


def store_keys(store_root) -> list[str]:
    """Every sequence key held in the store, over all its parts (repeats included)."""
    store = stores.Store(str(store_root))
    found = []
    for key in store.settings_keys():
        for name in store.parts(key):
            with h5py.File(store.part(key, name)) as h5:
                found += h5["sequence_sha256"][:].astype(str).tolist()
    return found


def unique(records):
    return len({s for _, s in records})


@pytest.fixture(scope="module")
def incremental(tmp_path_factory):
    """Run A, then run B into the same outdir, then B from scratch elsewhere."""
    work = tmp_path_factory.mktemp("incremental")
    a, b = fasta(work / "a.fasta", A), fasta(work / "b.fasta", B)
    outdir = work / "results"
    first = run(work, a, outdir, "shards=1")
    a_shards = planned(outdir)
    second = run(work, b, outdir, "shards=1")
    scratch = work / "scratch"
    run(work, b, scratch, "shards=1")
    return work, outdir, scratch, first, second, a_shards


def test_a_grown_input_computes_only_the_new_sequences(incremental):
    work, outdir, scratch, first, second, a_shards = incremental
    counts = run_json(outdir)
    assert counts.pop("computed_with") and counts.pop("esmshard_version")
    assert counts.pop("precisions") == ["fp32"] and counts.pop("devices") == ["cpu"]
    assert len(counts.pop("run_id")) == 16
    assert counts.pop("made_by")["model"] == MODEL
    assert counts.pop("command").startswith(f"{Path(sys.executable).parent}/snakemake ")
    assert counts.pop("typed_command") is None  # snakemake typed: no `esmshard run`
    assert counts.pop("workdir") and counts.pop("inputs") == [str((work / "b.fasta").resolve())]
    finished = counts.pop("finished_at")  # after this command's start, and its new plan
    assert finished > counts.pop("started_at") and finished > counts.pop("planned_at")
    assert (counts.pop("long_records"), counts.pop("long_said")) == (0, "")
    assert counts.pop("set_aside") == []  # no part failed its check
    assert counts == {
        "records": len(B),
        "unique_sequences": unique(B),
        "computed": len(NEW),
        "computed_by_this_command": len(NEW),
        "kept_from_stopped_jobs": 0,
        "residues_kept_from_stopped_jobs": 0,
        "from_store": unique(A),
        "embedded": len(B),
        "failed": 0,
        "store": str((outdir / "store").resolve()),
        "long_sequences": "truncate",
        "output_values": "copy",
    }
    shards = planned(outdir)
    assert not set(shards) & set(a_shards)  # A's shards are never rewritten
    metrics = [json.loads((outdir / "metrics" / f"{s}.json").read_text()) for s in shards]
    assert sum(m["n_sequences"] for m in metrics) == len(NEW)
    assert jobs_run(second)["embed"] == len(shards)
    assert f"{len(NEW)} computed ({len(NEW)} by this command), {unique(A)} from the store" in (
        second.stderr
    )

    got, want = means(outdir), means(scratch)
    assert list(got) == [h[1:].split()[0] for h, _ in B]  # every ID, in input order
    for id_ in want:
        np.testing.assert_allclose(got[id_], want[id_], atol=1e-5, rtol=0)
    for k, (h, _) in enumerate(COPIES):
        assert got[f"again{k}"].tobytes() == got[h.split()[1]].tobytes()
    with h5py.File(outdir / "embeddings.h5") as h5:
        keys = h5["sequence_sha256"][:].astype(str).tolist()
    assert keys == [stores.sequence_sha256(s.encode()) for _, s in B]
    assert sorted(set(store_keys(outdir / "store"))) == sorted(set(keys))
    assert len(store_keys(outdir / "store")) == unique(B)  # each sequence computed once


def test_the_same_command_again_computes_nothing(incremental):
    work, outdir, *_ = incremental
    again = run(work, work / "b.fasta", outdir, "shards=1")
    assert jobs_run(again) == {}


def test_a_shrunk_and_reordered_input_computes_nothing_and_only_merges(incremental):
    work, outdir, *_ = incremental
    shrunk = fasta(work / "shrunk.fasta", B[::-3])
    result = run(work, shrunk, outdir, "shards=1")
    assert jobs_run(result) == {"shard": 1, "merge": 1, "report": 1}
    assert run_json(outdir)["computed"] == 0
    got, want = means(outdir), means(work / "scratch")
    assert list(got) == [h[1:].split()[0] for h, _ in B[::-3]]
    for id_, mean in got.items():
        np.testing.assert_allclose(mean, want[id_], atol=1e-5, rtol=0)
    run(work, work / "b.fasta", outdir, "shards=1")  # back to B for the tests below


@pytest.mark.parametrize(
    "change, recomputed",
    [
        (["repr_layers=[-1,3]"], True),
        ([f"model={OTHER_MODEL}"], True),
        (["toks_per_batch=512", "gpus=[0]"], False),
    ],
)
def test_only_settings_that_change_the_numbers_recompute(incremental, change, recomputed):
    work, outdir, *_ = incremental
    result = snakemake(
        work,
        {},
        "--resources",
        "gpu=1",
        *config(work / "b.fasta", outdir, "shards=1"),
        *change,
    )
    if recomputed:
        assert run_json(outdir)["computed"] == unique(B)
        assert run_json(outdir)["from_store"] == 0
    else:
        assert "embed" not in jobs_run(result)
        assert run_json(outdir)["computed"] == 0


def test_kill_9_during_a_grown_run_then_the_same_command(tmp_path):
    a, b = fasta(tmp_path / "a.fasta", A), fasta(tmp_path / "b.fasta", B)
    outdir = tmp_path / "results"
    run(tmp_path, a, outdir, "shards=1")
    cmd, env = snakemake_command(
        tmp_path, {}, "--resources", "gpu=1", *config(b, outdir, "shards=4")
    )
    kill_9_after_shards(cmd, env, outdir / "store", 1 + 2)  # A's one shard, then two of B's
    shards = planned(outdir)
    store = stores.Store(str(outdir / "store"))
    (key,) = store.settings_keys()
    finished = [s for s in shards if os.path.exists(store.part(key, s))]
    parts = {s: store.part(key, s) for s in finished}
    before = {s: (p, os.stat(p).st_mtime_ns) for s, p in parts.items()}
    assert 2 <= len(finished) < 4

    again = run(tmp_path, b, outdir, "shards=4")
    assert jobs_run(again)["embed"] == 4 - len(finished)
    assert "shard" not in jobs_run(again)
    assert {s: (p, os.stat(p).st_mtime_ns) for s, (p, _) in before.items()} == before
    assert run_json(outdir)["computed"] == len(NEW)
    by_this_command = sum(
        json.loads((outdir / "metrics" / f"{s}.json").read_text())["n_sequences"]
        for s in shards
        if s not in finished
    )
    assert 0 < by_this_command < len(NEW)
    assert run_json(outdir)["computed_by_this_command"] == by_this_command
    assert f"{len(NEW)} computed ({by_this_command} by this command)" in again.stderr
    assert len(store_keys(outdir / "store")) == unique(B)  # no sequence computed twice


def test_two_runs_sharing_a_store_at_once(tmp_path, incremental):
    _, _, scratch, *_ = incremental
    x = fasta(tmp_path / "x.fasta", B[: len(B) * 2 // 3])
    y = fasta(tmp_path / "y.fasta", B[len(B) // 3 :])
    shared = tmp_path / "lab-store"
    runs = []
    for name, path in (("x", x), ("y", y)):
        cmd, env = snakemake_command(
            tmp_path / name,
            {},
            "--resources",
            "gpu=1",
            *config(path, tmp_path / name / "results", "shards=2", f"store={shared}"),
        )
        runs.append(
            subprocess.Popen(
                cmd, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
        )
    for process in runs:
        out, err = process.communicate(timeout=600)
        assert process.returncode == 0, out + err
    want = means(scratch)
    for name in ("x", "y"):
        got = means(tmp_path / name / "results")
        for id_, mean in got.items():
            np.testing.assert_allclose(mean, want[id_], atol=1e-5, rtol=0)
    store = stores.Store(str(shared))
    (key,) = store.settings_keys()
    cache = tmp_path / "checksums.json"
    assert all(stores.check_part(store, key, name, cache) is None for name in store.parts(key))
    assert set(store_keys(shared)) == {stores.sequence_sha256(s.encode()) for _, s in B}
    own = {".locks", stores.MARKER}
    hidden = [p for p in shared.rglob("*") if p.name.startswith(".") and p.name not in own]
    assert not hidden  # nothing half-written
    assert json.loads((shared / stores.MARKER).read_text()) == {"esmshard_store_format": 1}
    locks = sorted(p.name for p in (shared / ".locks").iterdir())  # each run said who it was
    assert locks[0] == f"{key}.lock" and all(n.startswith(f"{key}.") for n in locks)

    listing = subprocess.run(
        ["esmshard", "store", str(tmp_path / "x" / "results")],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert f"{shared}:" in listing and f"{key}: {len(store_keys(shared))} sequences" in listing
    subprocess.run(["esmshard", "store", str(shared), "--remove", key], env=env, check=True)
    assert store.settings_keys() == []


def test_kill_9_during_the_shard_step_then_the_same_command(tmp_path):
    # Many records (the test proteins under new IDs), so that the shard step takes a while.
    tiled = "".join(
        f">copy{k}_{h[1:]}\n{seq}\n" for k in range(1500) for h, seq in read_records(PROTEINS)
    )
    big = tmp_path / "tiled.fasta"
    big.write_text(tiled)
    outdir = tmp_path / "results"
    cmd, env = snakemake_command(tmp_path, {}, "--resources", "gpu=1", *config(big, outdir))
    kill_9_when(cmd, env, lambda: any(outdir.glob(".keys-*.tmp/run.*")))
    assert not (outdir / "shards").exists()  # no half-made plan under the final name
    killed = leftovers(outdir)
    assert any(".shards." in p for p in killed) and any(".keys-" in p for p in killed)

    again = run(tmp_path, big, outdir)
    assert jobs_run(again)["shard"] == 1
    assert run_json(outdir)["records"] == 1500 * len(read_records(PROTEINS))
    assert leftovers(outdir) == []
    assert "leftovers of killed runs: " in again.stderr


def test_kill_9_during_merge_then_the_same_command_leaves_nothing_behind(tmp_path):
    # Many records of few sequences: each is computed once, and merge has a while to run.
    a = fasta(
        tmp_path / "a.fasta", [(f">copy{k}_{h[1:]}", s) for k in range(2000) for h, s in A[:20]]
    )
    outdir, store = tmp_path / "results", tmp_path / "lab-store"
    # esm2_t6's D = 320, not the micro model's 32: merge must copy enough to be caught running.
    args = ["--resources", "gpu=1", "--config", f"input={a}", f"outdir={outdir}",
            f"model=random:{TINY_MODEL}", "shards=2", f"store={store}"]  # fmt: skip
    cmd, env = snakemake_command(tmp_path, {}, *args)
    kill_9_when(cmd, env, lambda: any(outdir.glob(".merge-spill-*.tmp")))
    assert any(".merge-spill-" in p for p in leftovers(outdir, store))
    orphan = next(store.glob("*/settings.json")).with_name("0123456789ab-0000.json")
    orphan.write_text("{}")  # an embed job killed between its manifest and its part
    again = snakemake(tmp_path, {}, *args)
    assert jobs_run(again) == {"merge": 1, "report": 1}
    assert leftovers(outdir, store) == [] and not orphan.exists()


def test_a_damaged_or_foreign_store_part_is_set_aside_and_recomputed_by_the_same_command(
    tmp_path,
):
    """A byte changed in a part, then another model's part (manifest and all) copied over one:
    each time the next outdir's command sets the part aside, recomputes its sequences and ends
    with the numbers of a clean run; the same command again runs nothing."""
    a = fasta(tmp_path / "a.fasta", A)
    shared = tmp_path / "lab-store"
    clean = tmp_path / "clean"
    run(tmp_path, a, clean, "shards=2", f"store={shared}")
    store = stores.Store(str(shared))
    (key,) = store.settings_keys()
    first, second = (Path(store.part(key, name)) for name in store.parts(key))
    with open(first, "r+b") as fh:  # bit rot in the middle of the file
        fh.seek(first.stat().st_size // 2)
        byte = fh.read(1)
        fh.seek(-1, 1)
        fh.write(bytes([byte[0] ^ 0x01]))

    other_model = f"model={OTHER_MODEL}"
    run(tmp_path, fasta(tmp_path / "few.fasta", A[:3]), tmp_path / "other", other_model,
        f"store={shared}")  # fmt: skip
    (foreign_key,) = set(store.settings_keys()) - {key}
    (foreign,) = (Path(store.part(foreign_key, n)) for n in store.parts(foreign_key))

    for case, damaged in (("damaged", first), ("foreign", second)):
        if case == "foreign":
            shutil.copy(foreign, damaged)
            shutil.copy(foreign.with_suffix(".json"), damaged.with_suffix(".json"))
        outdir = tmp_path / case
        result = run(tmp_path, a, outdir, "shards=1", f"store={shared}")
        assert jobs_run(result) == {"shard": 1, "embed": 1, "merge": 1, "report": 1}
        set_aside = [damaged.with_suffix(".h5.corrupt"), damaged.with_suffix(".json.corrupt")]
        assert all(p.is_file() for p in set_aside) and not damaged.exists()
        assert not damaged.with_suffix(".json").exists()
        shard_log = (outdir / "logs" / "shard.log").read_text()
        for path in (damaged, *set_aside):
            assert str(path) in shard_log and str(path) in result.stderr
        got, want = means(outdir), means(clean)
        assert list(got) == list(want)
        assert all(got[id_].tobytes() == want[id_].tobytes() for id_ in want)
        assert jobs_run(run(tmp_path, a, outdir, "shards=1", f"store={shared}")) == {}


def test_store_maintenance_beside_runs_verify_and_prune(tmp_path):
    """--remove refuses while a run uses the key, naming it; --verify finds a damaged part;
    --prune lists what no kept outdir uses, then removes it; the kept outdir stays whole."""
    x = fasta(tmp_path / "x.fasta", A)
    y = fasta(tmp_path / "y.fasta", NEW)
    shared = tmp_path / "lab-store"
    store = stores.Store(str(shared))

    def esmshard(*args):
        return subprocess.run(["esmshard", "store", str(shared), *args], capture_output=True,
                              text=True)  # fmt: skip

    cmd, env = snakemake_command(
        tmp_path / "x", {}, "--resources", "gpu=1",
        *config(x, tmp_path / "x" / "results", "shards=2", f"store={shared}"),
    )  # fmt: skip
    running = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)  # fmt: skip
    deadline = time.time() + 300
    while not store.settings_keys():
        assert running.poll() is None and time.time() < deadline
        time.sleep(0.05)
    (key,) = store.settings_keys()
    refused = esmshard("--remove", key)
    assert refused.returncode == 1
    assert f"cannot remove settings {key} of {shared}: in use by the run of process " in (
        refused.stderr
    )
    assert f"{running.pid}" in refused.stderr and "snakemake" in refused.stderr
    out, err = running.communicate(timeout=600)
    assert running.returncode == 0, err
    assert store.settings_keys() == [key]

    run(tmp_path / "y", y, tmp_path / "y" / "results", "shards=1", f"store={shared}")
    assert esmshard("--verify").returncode == 0
    parts = [Path(store.part(key, n)) for n in store.parts(key)]
    y_part = Path(store.part(key, planned(tmp_path / "y" / "results")[0]))
    victim = next(p for p in parts if p != y_part)
    with open(victim, "r+b") as fh:
        fh.seek(100)
        fh.write(b"\xff\xff")
    verified = esmshard("--verify")
    assert verified.returncode == 1 and f"damaged: {victim}: sha256 " in verified.stdout
    assert "3 parts checked, 1 damaged" in verified.stdout
    assert esmshard("--verify").returncode == 0  # set aside: the store is whole again

    keep = ["--prune", "--keep", str(tmp_path / "y" / "results")]
    listed = esmshard(*keep)
    assert listed.returncode == 0 and "nothing removed (add --apply" in listed.stdout
    dropped = [p for p in parts if p != y_part]
    for path in [*dropped, victim.with_suffix(".h5.corrupt"), victim.with_suffix(".json.corrupt")]:
        if path.exists():
            assert f"{path}\n" in listed.stdout
    assert all(p.exists() for p in dropped if p != victim)
    assert f"{y_part}" not in listed.stdout
    assert esmshard(*keep, "--apply").returncode == 0
    assert store.parts(key) == [y_part.stem] and not list(
        Path(store.folder(key)).glob("*.corrupt")
    )
    assert jobs_run(run(tmp_path / "y", y, tmp_path / "y" / "results", "shards=1",
                        f"store={shared}")) == {}  # fmt: skip


A_KEY = stores.sequence_sha256(b"MKV")


def test_check_part_says_what_is_wrong(tmp_path):
    settings = {"model": MODEL, "include": ["mean"]}
    key = stores.settings_key(settings)
    store = stores.Store(str(tmp_path / "store"))
    cache = tmp_path / "checksums.json"
    rep = {6: Representation.from_per_tok(np.ones((3, 4), np.float32), np.ones(4, np.float32))}
    part = write_part(store.root, settings, "abc-0000", [A_KEY], ["P1"], [rep])
    assert stores.check_part(store, key, "abc-0000", cache) is None
    manifest = Path(store.manifest(key, "abc-0000"))
    manifest.rename(manifest.with_suffix(".away"))
    assert stores.check_part(store, key, "abc-0000", cache).startswith("no readable manifest")
    manifest.with_suffix(".away").rename(manifest)
    moved = stores.set_aside(store, key, "abc-0000", "a test")
    assert moved == [f"{part}.corrupt", f"{manifest}.corrupt"]
    assert stores.check_part(store, key, "abc-0000", cache) == "its file is gone"


def test_a_kept_failure_counts_as_kept_in_the_listing_as_the_resumed_job_counts_it(tmp_path):
    """A stopped job's piece holds its embedded sequences and those that failed: neither is
    tried again, so `esmshard store` (run.json's kept_from_stopped_jobs too) counts both."""
    from esmshard.store.pieces import Pieces, PieceWriter
    from esmshard.store.shardfile import Failure

    settings = {"model": MODEL, "include": ["mean"]}
    key = stores.settings_key(settings)
    store = stores.Store(str(tmp_path / "store"))
    stores.add_settings(store, key, settings)
    pieces = Pieces(store, key, "abc-0000")
    writer = PieceWriter(pieces, [], [6], ["mean"], 4, {"settings": json.dumps(settings)})
    keys, ids = [A_KEY, stores.sequence_sha256(b"MKVL")], ["P1", "P2"]
    rep = {6: Representation.from_per_tok(np.ones((3, 4), np.float32), np.ones(4, np.float32))}
    writer.add(keys[:1], ids[:1], [0, 1], [rep])  # P2 failed in the batch
    writer.keep([Failure(1, "out of memory even alone")], keys, ids)
    (kept,) = [row for row in stores.summary(store) if row["key"] == key]
    assert kept["pieces"] == 1 and kept["piece_sequences"] == len(pieces.kept().keys) == 2


def test_a_damaged_store_names_itself_and_heals_like_a_damaged_part(tmp_path):
    """A manifest of the wrong shape, an unreadable settings.json and a folder where a part
    belongs: the listing and --verify go on and name them; the same command heals the store."""
    a = fasta(tmp_path / "a.fasta", A[:30])
    outdir = tmp_path / "results"
    run(tmp_path, a, outdir, "shards=3")
    before = means(outdir)
    store = stores.Store(str(outdir / "store"))
    (key,) = store.settings_keys()
    first, second, third = store.parts(key)
    Path(store.manifest(key, first)).write_text("[]")
    Path(store.part(key, second)).unlink()
    Path(store.part(key, second)).mkdir()
    esmshard = [str(Path(sys.executable).parent / "esmshard"), "store", str(outdir)]
    listing = subprocess.run(esmshard, capture_output=True, text=True)
    assert listing.returncode == 0 and f"  {key}: " in listing.stdout, listing.stderr
    verify = subprocess.run([*esmshard, "--verify"], capture_output=True, text=True)
    assert verify.returncode == 1 and "Traceback" not in verify.stderr
    text = verify.stdout + verify.stderr
    assert "its manifest holds list JSON, not a manifest" in text and "it is not a file" in text
    assert store.parts(key) == [third]
    # A settings.json damaged is no longer esmshard's mark: the folder is listed as left alone.
    Path(store.settings(key)).write_text("{not json")
    listing = subprocess.run(esmshard, capture_output=True, text=True)
    assert f"  {key}: not esmshard's, left alone" in listing.stdout, listing.stdout
    # The next run that needs their sequences computes them again, and writes the settings anew.
    again = tmp_path / "again"
    result = run(tmp_path, a, again, "shards=3", f"store={store.root}")
    assert jobs_run(result)["embed"] >= 1  # the two parts' sequences; the third part's reused
    assert run_json(again)["computed"] > 0 and run_json(again)["from_store"] > 0
    assert json.loads(Path(store.settings(key)).read_text())["model"] == MODEL
    after = means(again)
    assert after.keys() == before.keys()
    for id_, mean in before.items():
        np.testing.assert_allclose(after[id_], mean, atol=1e-6, rtol=0)
