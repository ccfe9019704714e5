"""merge on shard files written by the shard writer, without a model."""

import json

import h5py
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from esmshard.files import read_tsv
from esmshard.merge import CHUNK_BYTES, MergeError, merge
from esmshard.records import SCHEMA
from esmshard.representations import KINDS, Representation
from esmshard.shardfile import Failure, ShardWriter

DIM = 4
LENGTHS = [3, 5, 2, 4, 6]
IDS = [f"P{i}" for i in range(len(LENGTHS))]
SHARD_OF = ["shard_0000", "shard_0001", "shard_0000", "shard_0001", "shard_0000"]
SETTINGS = {
    "model": "random:esm2_t6_8M_UR50D",
    "repr_layers": [-1],
    "include": ["mean", "per_tok", "bos"],
    "truncation_seq_length": 1022,
    "long_sequences": "truncate",
    "precision": "auto",
    "fast_path": True,
    "checkpoint": "random weights, seed 0",
}


def rep(i: int) -> dict[int, Representation]:
    per_tok = np.arange(LENGTHS[i] * DIM, dtype=np.float32).reshape(LENGTHS[i], DIM) + 100 * i
    return {6: Representation(per_tok, np.full(DIM, i, dtype=np.float32))}


def stamp(h5, shard: str) -> None:
    """The attributes an embed job gives its shard file, with this module's settings."""
    h5.attrs.update(
        shard=shard,
        model="m",
        weights="random",
        precision="fp32",
        truncation_seq_length=1022,
        settings=json.dumps(SETTINGS),
    )


@pytest.fixture
def run(tmp_path):
    write_records(tmp_path, SHARD_OF)
    paths = []
    for shard in ("shard_0000", "shard_0001"):
        members = [i for i, s in enumerate(SHARD_OF) if s == shard][
            ::-1
        ]  # processing order differs
        failed = (
            [Failure(members.pop(), "out of memory even alone")] if shard == "shard_0001" else []
        )
        path = tmp_path / f"{shard}.h5"
        with h5py.File(path, "w") as h5:
            writer = ShardWriter(h5, [6], list(KINDS), DIM)
            writer.write(members, [IDS[i] for i in members], [rep(i) for i in members])
            writer.write_failed(failed, dict(enumerate(IDS)))
            stamp(h5, shard)
        paths.append(path)
    return tmp_path, paths


def write_records(folder, shard_of, ids=IDS, lengths=LENGTHS):
    """The record table as the shard step writes it, for records of in.fa."""
    rows = [
        dict(
            index=i,
            id=ids[i],
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


def merge_run(folder, paths, settings=SETTINGS, **output) -> dict:
    return merge(
        folder / "records.parquet",
        paths,
        folder / "embeddings.h5",
        folder / "failed.tsv",
        settings,
        **output,
    )


def test_every_kind_lands_in_input_order(run):
    folder, paths = run
    summary = merge_run(folder, paths)
    assert summary == {"n_records": 5, "n_embedded": 4, "n_failed": 1}
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
        assert set(h5) == {"ids", "headers", "lengths", "truncated", *KINDS}
    assert read_tsv(folder / "failed.tsv") == [
        {"id": "P1", "source": "in.fa:1", "reason": "out of memory even alone"}
    ]
    assert sorted(p.name for p in folder.iterdir() if p.name.startswith(".")) == []


def test_a_representation_kind_merge_does_not_know_is_refused(run):
    folder, paths = run
    with h5py.File(paths[0], "a") as h5:
        h5.create_dataset("attention/6", data=np.zeros((3, DIM)))
    with pytest.raises(
        MergeError, match=f"shard file {paths[0]} .*unknown representation kind.*attention"
    ):
        merge_run(folder, paths)
    assert not (folder / "embeddings.h5").exists()


def test_a_missing_record_is_named(run):
    folder, paths = run
    # the plan puts P1 where the shard file lacks it
    write_records(folder, ["shard_0000"] * 3 + SHARD_OF[3:])
    with pytest.raises(
        MergeError, match="shard file .*shard_0000.h5 holds 3 records where shard shard_0000 has 4"
    ):
        merge_run(folder, paths)


def test_a_shard_file_copied_over_another_shard_is_named(run):
    folder, paths = run
    paths[0].write_bytes(paths[1].read_bytes())
    with pytest.raises(
        MergeError, match=f"shard file {paths[0]} holds shard shard_0001, not shard_0000"
    ):
        merge_run(folder, paths)
    assert not (folder / "embeddings.h5").exists()


@pytest.mark.parametrize("key", sorted(SETTINGS))
def test_a_shard_file_of_other_settings_is_refused_naming_the_setting(run, key):
    folder, paths = run
    other = {**SETTINGS, key: "something else"}
    with pytest.raises(
        MergeError,
        match=f"shard file {paths[0]} was computed with {key} = .*this run has {key} = ",
    ):
        merge_run(folder, paths, other)
    assert not (folder / "embeddings.h5").exists()


@pytest.fixture
def realistic(tmp_path):
    """400 records with the real proteome's first lengths, two shards, per-residue and mean rows
    of ESM-2-like scale (normal, sd 0.5, a few large values) in 32 dimensions."""
    from conftest import PROTEOME, read_records

    lengths = [min(len(s), 300) for _, s in read_records(PROTEOME)[:400]]
    rng = np.random.default_rng(0)
    reps = {}
    for i, n in enumerate(lengths):
        per_tok = rng.normal(0, 0.5, (n, 32)).astype(np.float32) * (1 + 50 * (i == 7))
        reps[i] = {6: Representation(per_tok, per_tok[0])}
    ids = [f"Q{i}" for i in range(400)]
    write_records(tmp_path, [f"shard_000{i % 2}" for i in range(400)], ids, lengths)
    paths = []
    for k in range(2):
        members = list(range(k, 400, 2))[::-1]
        path = tmp_path / f"shard_000{k}.h5"
        with h5py.File(path, "w") as h5:
            writer = ShardWriter(h5, [6], ["mean", "per_tok"], 32)
            for start in range(0, len(members), 64):
                batch = members[start : start + 64]
                writer.write(batch, [ids[i] for i in batch], [reps[i] for i in batch])
            writer.write_failed([], {})
            stamp(h5, path.stem)
        paths.append(path)
    return tmp_path, paths, reps


def stored(path, name) -> int:
    with h5py.File(path) as h5:
        return h5[name].id.get_storage_size()


def test_float16_and_compressed_per_residue_read_back_within_the_documented_error(realistic):
    folder, paths, reps = realistic
    sizes = {}
    for dtype in ("float32", "float16"):
        for compression in ("none", "gzip", "lzf"):
            merge_run(folder, paths, output_dtype=dtype, per_residue_compression=compression)
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
        MergeError,
        match=f"per_tok/6 in shard file {paths[1]} holds values up to 70000.*output_dtype: float32",
    ):
        merge_run(folder, paths, output_dtype="float16")
    assert not (folder / "embeddings.h5").exists()


def test_an_output_of_many_windows_equals_one_window(realistic, monkeypatch):
    folder, paths, _ = realistic
    merge_run(folder, paths)
    whole = folder / "whole.h5"
    (folder / "embeddings.h5").rename(whole)
    monkeypatch.setattr(
        "esmshard.merge.WINDOW_BYTES", 5000
    )  # 39 rows of 32 floats: ~1,800 windows
    monkeypatch.setattr("esmshard.merge.BLOCK_BYTES", 3000)
    merge_run(folder, paths)
    with h5py.File(whole) as a, h5py.File(folder / "embeddings.h5") as b:
        for name in ("mean/6", "per_tok/6", "per_tok/offsets", "ids", "lengths"):
            assert np.array_equal(a[name][:], b[name][:]), name
    assert [p.name for p in folder.iterdir() if p.name.startswith(".")] == []


def test_a_shard_file_with_other_ids_is_named(run):
    folder, paths = run
    with h5py.File(paths[0], "a") as h5:
        ids = h5["ids"].asstr()[:].tolist()
        h5["ids"][1] = "not-" + ids[1]
    with pytest.raises(
        MergeError, match=f"shard file {paths[0]}: record \\d+ is 'not-P\\d' where the input has"
    ):
        merge_run(folder, paths)
    assert not (folder / "embeddings.h5").exists()
