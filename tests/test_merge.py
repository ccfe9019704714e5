"""merge on shard files written by the shard writer, without a model."""

import json

import h5py
import numpy as np
import pytest

from esmshard.files import read_tsv, write_tsv
from esmshard.merge import MergeError, merge
from esmshard.representations import KINDS, Representation
from esmshard.shard import RECORD_COLUMNS
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


@pytest.fixture
def run(tmp_path):
    records = [
        [i, IDS[i], SHARD_OF[i], n, n, 0, 0, f"in.fa:{i}", f"{IDS[i]} protein"]
        for i, n in enumerate(LENGTHS)
    ]
    write_tsv(tmp_path / "records.tsv", RECORD_COLUMNS, records)
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
            h5.attrs.update(
                shard=shard,
                model="m",
                weights="random",
                precision="fp32",
                truncation_seq_length=1022,
                settings=json.dumps(SETTINGS),
            )
        paths.append(path)
    return tmp_path, paths


def merge_run(folder, paths, settings=SETTINGS) -> dict:
    return merge(
        folder / "records.tsv", paths, folder / "embeddings.h5", folder / "failed.tsv", settings
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
    rows = read_tsv(folder / "records.tsv")
    rows[1]["shard"] = "shard_0000"  # the plan puts P1 where the shard file lacks it
    write_tsv(
        folder / "records.tsv", RECORD_COLUMNS, [[r[c] for c in RECORD_COLUMNS] for r in rows]
    )
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
