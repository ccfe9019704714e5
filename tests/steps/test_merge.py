"""merge on shard files written by the shard writer, without a model."""

import json
import shutil
from hashlib import sha256
from pathlib import Path

import h5py
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import assert_same_values, every_value, write_part

from esmshard.embeddings_h5.representations import LAYERED, Representation
from esmshard.files import read_tsv
from esmshard.input.records import SCHEMA
from esmshard.steps import merge as merge_step
from esmshard.steps import merge_rows
from esmshard.steps.merge import MergeError, merge
from esmshard.steps.merge_output import CHUNK_BYTES
from esmshard.store import Store, settings_key
from esmshard.store.shardfile import Failure

DIM = 4
LENGTHS = [3, 5, 2, 4, 6]
IDS = [f"P{i}" for i in range(len(LENGTHS))]
PLAN = "0123456789ab"  # this run's plan: its shards are PLAN-0000 and PLAN-0001
SHARD_OF = [f"{PLAN}-000{k}" for k in (0, 1, 0, 1, 0)]
SETTINGS = {
    "model": "random:esm2_t6_8M_UR50D",
    "repr_layers": [-1],
    "include": ["mean", "per_tok", "bos"],
    "truncation_seq_length": 1022,
    "long_sequences": "truncate",
    "precision": "auto",
    "fast_path": True,
    "checkpoint": "random weights, seed 0",
    "family": "esm2",
}


def key_(i: int) -> str:
    """The sequence key of record i's made-up sequence."""
    return sha256(f"SEQUENCE{i}".encode()).hexdigest()


key = key_


def rep(i: int) -> dict[int, Representation]:
    per_tok = np.arange(LENGTHS[i] * DIM, dtype=np.float32).reshape(LENGTHS[i], DIM) + 100 * i
    return {6: Representation.from_per_tok(per_tok, np.full(DIM, i, dtype=np.float32))}


def part_path(folder, name) -> Path:
    return Path(Store(str(folder / "store")).part(settings_key(SETTINGS), name))


@pytest.fixture
def run(tmp_path):
    write_records(tmp_path, SHARD_OF)
    paths = []
    for shard in sorted(set(SHARD_OF)):
        members = [i for i, s in enumerate(SHARD_OF) if s == shard][
            ::-1
        ]  # processing order differs
        failed = (
            [Failure(len(members) - 1, "out of memory even alone")] if shard.endswith("1") else []
        )
        done = members[: len(members) - len(failed)]
        paths.append(
            write_part(
                tmp_path / "store",
                SETTINGS,
                shard,
                [key(i) for i in members],
                [IDS[i] for i in members],
                [rep(i) for i in done],
                failed,
                include=list(LAYERED),
            )
        )
    return tmp_path, paths


def write_records(folder, shard_of, ids=IDS, lengths=LENGTHS, keys=None, plan=PLAN):
    """The record table and plan.json as the shard step writes them, for records of in.fa."""
    keys = keys or [key(i) for i in range(len(lengths))]
    rows = [
        dict(
            index=i,
            id=ids[i],
            sequence_sha256=keys[i],
            shard=shard_of[i],
            length=n,
            n_residues=n,
            truncated=False,
            n_replaced=0,
            file="in.fa",
            line=i,
            description="protein",
        )
        for i, n in enumerate(lengths)
    ]
    pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMA), folder / "records.parquet")
    unique = len(set(keys))
    computed = len({k for k, s in zip(keys, shard_of) if s.startswith(plan)})
    plan_json = {"plan": plan, "store": str(folder / "store"), "key": settings_key(SETTINGS)}
    counts = {"unique_sequences": unique, "computed": computed, "from_store": unique - computed}
    (folder / "plan.json").write_text(json.dumps({**plan_json, **counts}))


def merge_run(folder, settings=SETTINGS, **output) -> dict:
    return merge(
        folder / "records.parquet",
        folder / "plan.json",
        folder / "store",
        folder / "embeddings.h5",
        folder / "failed.tsv",
        folder / "run.json",
        settings,
        folder / "checksums.json",
        **output,
    )


def test_every_kind_lands_in_input_order(run):
    folder, paths = run
    summary = merge_run(folder)
    assert summary == json.loads((folder / "run.json").read_text())
    assert (summary["records"], summary["embedded"], summary["failed"]) == (5, 4, 1)
    embedded = [0, 2, 3, 4]  # P1 failed
    with h5py.File(folder / "embeddings.h5") as h5:
        assert h5["ids"].asstr()[:].tolist() == [IDS[i] for i in embedded]
        assert h5["headers"].asstr()[0] == "P0 protein"
        offsets = h5["per_tok/offsets"][:]
        for row, i in enumerate(embedded):
            want = rep(i)[6]
            np.testing.assert_array_equal(h5["mean/6"][row], want.per_tok.mean(0))
            np.testing.assert_array_equal(h5["bos/6"][row], want.bos)
            np.testing.assert_array_equal(
                h5["per_tok/6"][offsets[row] : offsets[row + 1]], want.per_tok
            )
        assert h5["sequence_sha256"][:].astype(str).tolist() == [key(i) for i in embedded]
        assert set(h5) == {"ids", "headers", "lengths", "truncated", "sequence_sha256", "id_index",
                           *LAYERED}  # fmt: skip
    assert read_tsv(folder / "failed.tsv") == [
        {"id": "P1", "source": "in.fa:1", "reason": "out of memory even alone"}
    ]
    assert sorted(p.name for p in folder.iterdir() if p.name.startswith(".")) == []


def test_a_representation_kind_merge_does_not_know_is_refused(run):
    folder, paths = run
    with h5py.File(paths[0], "a") as h5:
        h5.create_dataset("attention/6", data=np.zeros((3, DIM)))
    with pytest.raises(
        MergeError,
        match=f"store part {paths[0]} cannot be merged: .*unknown representation kind.*attention",
    ):
        merge_run(folder)
    assert not (folder / "embeddings.h5").exists()
    assert_set_aside(paths[0])


def assert_set_aside(path, manifest=True):
    """The part (and its manifest) renamed out of the way, none left under its own name."""
    assert not path.exists() and path.with_suffix(".h5.corrupt").is_file()
    assert path.with_suffix(".json.corrupt").is_file() == manifest
    assert not path.with_suffix(".json").exists()


def test_a_missing_record_is_named(run):
    folder, paths = run
    # the plan puts P1 where the shard file lacks it
    write_records(folder, [SHARD_OF[0]] * 3 + SHARD_OF[3:])
    with pytest.raises(
        MergeError,
        match=f"store part {paths[0]} cannot be merged: it holds no result for record 'P1' "
        "\\(in.fa:1\\).*run the same command again",
    ):
        merge_run(folder)
    assert_set_aside(paths[0])
    assert (folder / "records.parquet").exists()  # this run's part: its embed job runs again


def test_records_with_one_sequence_get_bitwise_equal_rows(run):
    folder, _ = run
    ids, lengths, keys = IDS + ["copy-of-P3", "copy-of-P0"], LENGTHS + [4, 3], None
    keys = [key(i) for i in range(5)] + [key(3), key(0)]
    write_records(folder, SHARD_OF + [SHARD_OF[3], SHARD_OF[0]], ids, lengths, keys)
    assert merge_run(folder)["unique_sequences"] == 5
    with h5py.File(folder / "embeddings.h5") as h5:
        row = {id_: k for k, id_ in enumerate(h5["ids"].asstr()[:])}
        offsets = h5["per_tok/offsets"][:]
        for copy, original in (("copy-of-P3", "P3"), ("copy-of-P0", "P0")):
            for name in ("mean/6", "bos/6"):
                assert h5[name][row[copy]].tobytes() == h5[name][row[original]].tobytes()
            tokens = [
                h5["per_tok/6"][offsets[row[i]] : offsets[row[i] + 1]] for i in (copy, original)
            ]
            assert tokens[0].tobytes() == tokens[1].tobytes()


def test_records_sharing_few_sequences_are_expanded_a_block_at_a_time(run, monkeypatch):
    """Many records over a few sequences (peptides, repertoires, tiled input): the merge
    repeats a shared row a block's worth of records at a time, never all of them at once."""
    folder, _ = run
    n = 5 * 200
    write_records(folder, [SHARD_OF[k % 5] for k in range(n)], [f"R{k}" for k in range(n)],
                  [LENGTHS[k % 5] for k in range(n)], [key(k % 5) for k in range(n)])  # fmt: skip
    largest = {}
    blocks_with_rows = merge_rows.blocks_with_rows

    def measured(part, name, placement, dtype):
        for rows, block in blocks_with_rows(part, name, placement, dtype):
            largest[name] = max(largest.get(name, 0), len(block))
            yield rows, block

    monkeypatch.setattr(merge_rows, "blocks_with_rows", measured)
    monkeypatch.setattr(merge_rows, "BLOCK_BYTES", 3000)  # 187 rows of 4 float32
    assert merge_run(folder)["embedded"] == 800  # P1's 200 records failed
    assert 0 < largest["mean/6"] <= 187 and largest["bos/6"] <= 187
    with h5py.File(folder / "embeddings.h5") as h5:
        sequence = [int(id_[1:]) % 5 for id_ in h5["ids"].asstr()[:]]
        assert np.array_equal(h5["mean/6"][:], np.stack([rep(i)[6].mean for i in sequence]))
        assert np.array_equal(h5["bos/6"][:], np.stack([rep(i)[6].bos for i in sequence]))


def test_a_store_part_changed_since_the_plan_is_named(run):
    folder, paths = run
    write_records(folder, SHARD_OF, plan="fedcba987654")  # both parts: from the store
    with open(paths[1], "r+b") as fh:
        fh.seek(-50, 2)
        fh.write(b"\xff")
    plan = folder / "shards"  # the plan's own folder, as a run has it
    plan.mkdir()
    for name in ("records.parquet", "plan.json"):
        (folder / name).rename(plan / name)
    with pytest.raises(
        MergeError, match=f"store part {paths[1]} cannot be merged: sha256 .*command again"
    ):
        merge(plan / "records.parquet", plan / "plan.json", folder / "store",
              folder / "embeddings.h5", folder / "failed.tsv", folder / "run.json", SETTINGS,
              folder / "checksums.json")  # fmt: skip
    assert not (folder / "embeddings.h5").exists()
    assert_set_aside(paths[1])
    assert not plan.exists()  # the same command plans the part's sequences anew


def test_a_shard_file_copied_over_another_shard_is_named(run):
    folder, paths = run
    paths[0].write_bytes(paths[1].read_bytes())
    with pytest.raises(
        MergeError,
        match=f"store part {paths[0]} cannot be merged: it holds shard {PLAN}-0001, "
        f"not {PLAN}-0000",
    ):
        merge_run(folder)
    assert not (folder / "embeddings.h5").exists()
    assert_set_aside(paths[0])


@pytest.mark.parametrize("key", sorted(SETTINGS))
def test_a_shard_file_of_other_settings_is_refused_naming_the_setting(run, key):
    """A part of other settings copied over one of the run's, manifest and all."""
    folder, paths = run
    other = {**SETTINGS, key: "something else"}
    copied = write_part(folder / "elsewhere", other, f"{PLAN}-0000", [key_(0)], ["P0"], [rep(0)])
    shutil.copy(copied, paths[0])
    shutil.copy(copied.with_suffix(".json"), paths[0].with_suffix(".json"))
    with pytest.raises(
        MergeError,
        match=f"store part {paths[0]} cannot be merged: it was computed with other settings "
        f"\\({key} = .* where the store has ",
    ):
        merge_run(folder)
    assert not (folder / "embeddings.h5").exists()
    assert_set_aside(paths[0])


def test_a_run_with_other_settings_than_its_plan_is_refused(run):
    folder, _ = run
    with pytest.raises(MergeError, match="planned with other embedding settings"):
        merge_run(folder, {**SETTINGS, "include": ["mean"]})


@pytest.fixture
def realistic(tmp_path):
    """400 records with the real proteome's first lengths, two shards, per-residue and mean rows
    of ESM-2-like scale (normal, sd 0.5, a few large values) in 32 dimensions."""
    from helpers import PROTEOME, read_records

    lengths = [min(len(s), 300) for _, s in read_records(PROTEOME)[:400]]
    rng = np.random.default_rng(0)
    reps = {}
    for i, n in enumerate(lengths):
        per_tok = rng.normal(0, 0.5, (n, 32)).astype(np.float32) * (1 + 50 * (i == 7))
        reps[i] = {6: Representation.from_per_tok(per_tok, per_tok[0])}
    ids = [f"Q{i}" for i in range(400)]
    write_records(tmp_path, [f"{PLAN}-000{i % 2}" for i in range(400)], ids, lengths)
    paths = []
    for k in range(2):
        members = list(range(k, 400, 2))[::-1]
        paths.append(
            write_part(
                tmp_path / "store",
                SETTINGS,
                f"{PLAN}-000{k}",
                [key(i) for i in members],
                [ids[i] for i in members],
                [reps[i] for i in members],
                include=["mean", "per_tok"],
            )
        )
    return tmp_path, paths, reps


def stored(path, name) -> int:
    with h5py.File(path) as h5:
        return h5[name].id.get_storage_size()


def test_float16_and_compressed_per_residue_read_back_within_the_documented_error(realistic):
    folder, paths, reps = realistic
    sizes = {}
    for dtype in ("float32", "float16"):
        for compression in ("none", "gzip", "lzf"):
            merge_run(folder, output_dtype=dtype, per_residue_compression=compression)
            out = folder / "embeddings.h5"
            sizes[dtype, compression] = stored(out, "per_tok/6"), out.stat().st_size
            with h5py.File(out) as h5:
                assert h5["per_tok/6"].dtype == np.dtype(dtype) == h5["mean/6"].dtype
                offsets = h5["per_tok/offsets"][:]
                for row in (0, 7, 399):
                    got = h5["per_tok/6"][offsets[row] : offsets[row + 1]].astype(np.float32)
                    want = reps[row][6].per_tok
                    # the README's bound: exact in float32; |error| <= 2^-11·|x| + 2^-25 in float16
                    bound = 0 if dtype == "float32" else 2**-11 * np.abs(want) + 2**-25
                    assert np.all(np.abs(got - want) <= bound)
                    mean = h5["mean/6"][row].astype(np.float32)
                    assert np.all(
                        np.abs(mean - want.mean(0)) <= 2**-11 * np.abs(want.mean(0)) + 2**-25
                    )
    data = 4 * 32 * sum(len(r[6].per_tok) for r in reps.values())
    raw = sizes["float32", "none"][0]
    assert data <= raw < data + CHUNK_BYTES  # chunks of CHUNK_BYTES, the last one partly used
    assert data / 2 <= sizes["float16", "none"][0] < data / 2 + CHUNK_BYTES
    assert sizes["float32", "gzip"][0] < data and sizes["float16", "gzip"][0] < data / 2
    assert sizes["float16", "none"][1] < 0.6 * sizes["float32", "none"][1]  # the whole file


def test_values_beyond_float16_are_refused_not_written_as_infinity(realistic):
    folder, paths, _ = realistic
    with h5py.File(paths[1], "a") as h5:
        h5["per_tok/6"][3] = 70000.0
    with pytest.raises(
        ValueError,
        match=f"per_tok/6 in shard file {paths[1]} holds values up to 70000.*output_dtype: float32",
    ):
        merge_run(folder, output_dtype="float16")
    assert not (folder / "embeddings.h5").exists()


def test_an_output_of_many_windows_equals_one_window(realistic, monkeypatch):
    folder, paths, _ = realistic
    merge_run(folder)
    whole = folder / "whole.h5"
    (folder / "embeddings.h5").rename(whole)
    monkeypatch.setattr(
        "esmshard.steps.merge_rows.WINDOW_BYTES", 5000
    )  # 39 rows of 32 floats: ~1,800 windows
    monkeypatch.setattr("esmshard.steps.merge_rows.BLOCK_BYTES", 3000)
    merge_run(folder)
    with h5py.File(whole) as a, h5py.File(folder / "embeddings.h5") as b:
        for name in ("mean/6", "per_tok/6", "per_tok/offsets", "ids", "lengths"):
            assert np.array_equal(a[name][:], b[name][:]), name
    assert [p.name for p in folder.iterdir() if p.name.startswith(".")] == []


def test_a_part_whose_sequences_are_other_ones_is_named(run):
    folder, paths = run
    with h5py.File(paths[0], "a") as h5:
        h5["sequence_sha256"][1] = key(99).encode()
    with pytest.raises(
        MergeError,
        match=f"store part {paths[0]} cannot be merged: it holds no result for record 'P",
    ):
        merge_run(folder)
    assert not (folder / "embeddings.h5").exists()


@pytest.mark.parametrize("output_dtype", ["float32", "float16"])
def test_values_in_place_read_as_the_copy_holds_them(realistic, output_dtype):
    folder, paths, _ = realistic
    merge_run(folder, output_dtype=output_dtype)
    copied = folder / "copy.h5"
    (folder / "embeddings.h5").rename(copied)
    merge_run(folder, output_dtype=output_dtype, output_values="in_place")
    in_place = folder / "embeddings.h5"
    with h5py.File(in_place) as h5:
        assert h5.attrs["output_values"] == "in_place" and "per_tok/6" not in h5
        # the store is inside the outdir's folder here: its parts are named relative to it
        assert h5["in_place/parts"].asstr()[:].tolist() == [
            str(p.relative_to(folder)) for p in paths
        ]
    assert_same_values(every_value(copied), every_value(in_place))
    assert in_place.stat().st_size < 0.1 * sum(p.stat().st_size for p in paths)


def test_in_place_failed_records_and_bos_read_as_the_copy_holds_them(run):
    folder, _ = run
    merge_run(folder)
    (folder / "embeddings.h5").rename(folder / "copy.h5")
    merge_run(folder, output_values="in_place")
    assert_same_values(every_value(folder / "copy.h5"), every_value(folder / "embeddings.h5"))
    assert read_tsv(folder / "failed.tsv")[0]["reason"] == "out of memory even alone"


def test_values_in_place_whose_part_is_gone_or_changed_are_refused_naming_it(realistic):
    from esmshard.files import DamagedFileError
    from esmshard.outputs.reader import Embeddings

    folder, paths, _ = realistic
    merge_run(folder, output_values="in_place")
    kept = paths[1].read_bytes()
    with open(paths[1], "ab") as fh:
        fh.write(b"more")
    with pytest.raises(DamagedFileError, match=f"{paths[1]} has changed"):
        Embeddings(folder / "embeddings.h5")
    paths[1].unlink()
    with pytest.raises(DamagedFileError, match=f"{paths[1]} is gone.*run the same command"):
        Embeddings(folder / "embeddings.h5")
    paths[1].write_bytes(kept)
    with Embeddings(folder / "embeddings.h5") as emb:
        assert len(emb) == 400
    # its bytes changed where they lie, the size kept: refused, never read as numbers
    with open(paths[1], "r+b") as fh:
        fh.seek(len(kept) // 2)
        fh.write(bytes(16))
    with pytest.raises(DamagedFileError, match=f"{paths[1]} has changed: sha256 "):
        Embeddings(folder / "embeddings.h5")


def test_auto_leaves_values_in_place_above_its_size(realistic, monkeypatch):
    folder, _, _ = realistic
    monkeypatch.setattr(merge_step, "AUTO_IN_PLACE_BYTES", 1 << 30)
    merge_run(folder, output_values="auto")
    with h5py.File(folder / "embeddings.h5") as h5:
        assert h5.attrs["output_values"] == "copy"
    monkeypatch.setattr(merge_step, "AUTO_IN_PLACE_BYTES", 1 << 20)
    merge_run(folder, output_values="auto")
    with h5py.File(folder / "embeddings.h5") as h5:
        assert h5.attrs["output_values"] == "in_place"
