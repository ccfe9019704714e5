import os

import pandas as pd
import pytest
from conftest import NUCLEOTIDE, PROTEINS, fill, read_records, small_disk

from esmshard.fasta import FastaError
from esmshard.files import DiskFullError
from esmshard.shard import read_shard, write_shards


def test_write_shards_partitions_every_record(tmp_path):
    plan = write_shards([PROTEINS], tmp_path, 3, 1022, 320)
    records = pd.read_parquet(tmp_path / "records.parquet")
    raw = read_records(PROTEINS)
    assert records["id"].tolist() == [h[1:].split()[0] for h, _ in raw]
    assert records["description"][0] == raw[0][0][1:].split(maxsplit=1)[1]
    assert records["index"].tolist() == list(range(len(raw)))
    assert records["length"].tolist() == [len(s) for _, s in raw]
    assert (records["file"] == str(PROTEINS)).all() and records["line"][0] == 1
    in_shards = {}
    for p in plan:
        shard = read_shard(tmp_path / f"{p['shard']}.tsv")
        assert len(shard.ids) == p["n_sequences"] and shard.indices == sorted(shard.indices)
        assert (records["shard"][shard.indices] == p["shard"]).all()
        in_shards.update(zip(shard.indices, shard.sequences))
    assert sorted(in_shards) == list(range(len(records)))
    assert [in_shards[i] for i in range(len(records))] == [s for _, s in raw]
    assert records["truncated"].sum() == sum(len(s) > 1022 for _, s in raw)
    assert (records["n_residues"] == records["length"].clip(upper=1022)).all()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["records.parquet", "plan.tsv", "shard_0000.tsv", "shard_0001.tsv", "shard_0002.tsv"]
    )


def test_ids_with_quotes_and_tabs_in_headers_survive_the_shard_files(tmp_path):
    (header, seq), second = read_records(PROTEINS)[:2]
    fasta = tmp_path / "in.fasta"
    fasta.write_text(f'>it\'s"q"\tdescription\twith tabs\n{seq}\n{second[0]}\n{second[1]}\n')
    write_shards([fasta], tmp_path / "shards", 1, 1022, 320)
    shard = read_shard(tmp_path / "shards" / "shard_0000.tsv")
    assert shard.ids[0] == 'it\'s"q"' and shard.sequences == [seq, second[1]]


def test_duplicate_ids_across_files_name_both_places(tmp_path):
    header, seq = read_records(PROTEINS)[5]
    second = tmp_path / "second.fasta"
    second.write_text(f"{header}\n{seq}\n")
    with pytest.raises(FastaError) as err:
        write_shards([PROTEINS, second], tmp_path / "shards", 2, 1022, 320)
    message = str(err.value)
    assert "duplicate" in message and header[1:].split()[0] in message
    assert f"{PROTEINS}:" in message and f"{second}:1" in message
    assert list((tmp_path / "shards").iterdir()) == []  # nothing written, no spool left


def test_nucleotide_file_is_refused_naming_file_and_count(tmp_path):
    with pytest.raises(FastaError) as err:
        write_shards([PROTEINS, NUCLEOTIDE], tmp_path / "shards", 2, 1022, 320)
    message = str(err.value)
    assert f"{NUCLEOTIDE}: 10 records" in message and "nucleotide_check: false" in message
    assert str(PROTEINS) not in message
    assert list((tmp_path / "shards").iterdir()) == []


def test_nucleotide_check_can_be_switched_off(tmp_path):
    plan = write_shards([NUCLEOTIDE], tmp_path, 1, 1022, 320, nucleotide_check=False)
    assert plan[0]["n_sequences"] == 10


def test_a_disk_without_room_for_the_shards_is_refused_before_reading(tmp_path):
    with small_disk(tmp_path / "disk", 1) as disk:
        fill(disk, PROTEINS.stat().st_size)  # room for one copy of the input, not two
        with pytest.raises(
            DiskFullError, match=f"no space left for {disk / 'shards'}: it needs about"
        ):
            write_shards([PROTEINS], disk / "shards", 2, 1022, 320)
        assert os.listdir(disk / "shards") == []


def test_ids_whose_hashes_collide_are_not_duplicates(tmp_path, monkeypatch):
    monkeypatch.setattr("esmshard.shard.id_hash", lambda id_: 7)  # every ID collides
    plan = write_shards([PROTEINS], tmp_path / "shards", 2, 1022, 320)
    assert sum(p["n_sequences"] for p in plan) == len(read_records(PROTEINS))
    header, seq = read_records(PROTEINS)[5]
    second = tmp_path / "second.fasta"
    second.write_text(f"{header}\n{seq}\n")
    with pytest.raises(
        FastaError, match=f"duplicate ID '{header[1:].split()[0]}': at {PROTEINS}:"
    ):
        write_shards([PROTEINS, second], tmp_path / "again", 2, 1022, 320)


def test_too_long_records_are_named_up_to_twenty_and_counted(tmp_path):
    header, seq = max(read_records(PROTEINS), key=lambda r: len(r[1]))
    fasta = tmp_path / "long.fasta"
    fasta.write_text("".join(f">long{i}\n{seq}\n" for i in range(25)))
    with pytest.raises(FastaError) as err:
        write_shards([fasta], tmp_path / "shards", 1, 100, 320, long_sequences="fail")
    message = str(err.value)
    assert message.startswith("25 sequences are longer than truncation_seq_length (100)")
    assert f"long19 ({len(seq)} residues, {fasta}:39)" in message and "long20" not in message
    assert "and 5 more" in message
