import os
from hashlib import sha256

import numpy as np
import pandas as pd
import pytest
from helpers import (
    NUCLEOTIDE,
    PROTEINS,
    SHARD_SETTINGS,
    fill,
    plan_shards,
    read_records,
    small_disk,
    write_part,
)

from esmshard.embeddings_h5.representations import Representation
from esmshard.files import DiskFullError
from esmshard.input.fasta import FastaError
from esmshard.steps.shard import read_shard

SETTINGS = SHARD_SETTINGS


def embed_without_a_model(store, shard_tsv):
    """The store part of a shard file, with made-up representations."""
    shard = read_shard(shard_tsv)
    reps = [
        {6: Representation.from_per_tok(np.ones((len(s), 4), np.float32), np.zeros(4, np.float32))}
        for s in shard.sequences
    ]
    return write_part(store, SETTINGS, shard_tsv.stem, shard.keys, shard.ids, reps)


def test_write_shards_partitions_every_record(tmp_path):
    plan = plan_shards([PROTEINS], tmp_path, 3)
    records = pd.read_parquet(tmp_path / "records.parquet")
    raw = read_records(PROTEINS)
    assert records["id"].tolist() == [h[1:].split()[0] for h, _ in raw]
    assert records["description"][0] == raw[0][0][1:].split(maxsplit=1)[1]
    assert records["index"].tolist() == list(range(len(raw)))
    assert records["length"].tolist() == [len(s) for _, s in raw]
    assert records["sequence_sha256"].tolist() == [sha256(s.encode()).hexdigest() for _, s in raw]
    assert (records["file"] == str(PROTEINS)).all() and records["line"][0] == 1
    in_shards = {}
    for p in plan["shards"]:
        shard = read_shard(tmp_path / f"{p['shard']}.tsv")
        assert len(shard.ids) == p["n_sequences"]
        rows = records.set_index("id").loc[shard.ids]
        assert rows["index"].is_monotonic_increasing and (rows["shard"] == p["shard"]).all()
        assert rows["sequence_sha256"].tolist() == shard.keys
        in_shards.update(zip(shard.ids, shard.sequences))
    assert [in_shards[h[1:].split()[0]] for h, _ in raw] == [s for _, s in raw]
    assert records["truncated"].sum() == sum(len(s) > 1022 for _, s in raw)
    assert (records["n_residues"] == records["length"].clip(upper=1022)).all()
    names = [p["shard"] for p in plan["shards"]]
    assert names == [f"{plan['plan']}-{k:04d}" for k in range(3)]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["records.parquet", "plan.tsv", "plan.json"] + [f"{name}.tsv" for name in names]
    )
    assert plan["records"] == plan["unique_sequences"] == plan["computed"] == len(raw)


def test_each_sequence_is_planned_once_and_what_the_store_holds_not_at_all(tmp_path):
    raw = read_records(PROTEINS)
    first = tmp_path / "first.fasta"
    first.write_text("".join(f"{h}\n{s}\n" for h, s in raw[::2]))
    grown = tmp_path / "grown.fasta"  # the first, then every other record, then 3 again as copies
    copies = [(f">copy{k} of {h[1:]}", s) for k, (h, s) in enumerate(raw[:6:2])]
    grown.write_text("".join(f"{h}\n{s}\n" for h, s in raw[::2] + raw[1::2] + copies))
    store = tmp_path / "store"
    plan_shards([first], tmp_path / "a", 2, store=store)
    for path in (tmp_path / "a").glob("*-*.tsv"):  # as if the embed jobs had run
        embed_without_a_model(store, path)

    plan = plan_shards([grown], tmp_path / "b", 2, store=store)
    assert (plan["records"], plan["unique_sequences"]) == (len(raw) + 3, len(raw))
    assert (plan["from_store"], plan["computed"]) == (len(raw[::2]), len(raw[1::2]))
    planned = [read_shard(tmp_path / "b" / f"{p['shard']}.tsv") for p in plan["shards"]]
    assert sorted(s for shard in planned for s in shard.sequences) == sorted(
        s for _, s in raw[1::2]
    )
    records = pd.read_parquet(tmp_path / "b" / "records.parquet").set_index("id")
    for k, (h, _) in enumerate(raw[:6:2]):
        assert records.loc[f"copy{k}", "shard"] == records.loc[h[1:].split()[0], "shard"]
    old = set(records["shard"]) - {p["shard"] for p in plan["shards"]}
    assert old == {p.stem for p in (tmp_path / "a").glob("*-*.tsv")}


def test_a_store_part_that_fails_its_check_is_set_aside_and_recomputed(tmp_path):
    store = tmp_path / "store"
    plan_shards([PROTEINS], tmp_path / "a", 2, store=store)
    parts = [embed_without_a_model(store, p) for p in sorted((tmp_path / "a").glob("*-*.tsv"))]
    with open(parts[0], "r+b") as fh:  # one flipped byte, size unchanged
        fh.seek(-100, os.SEEK_END)
        byte = fh.read(1)
        fh.seek(-100, os.SEEK_END)
        fh.write(bytes([byte[0] ^ 0xFF]))

    plan = plan_shards([PROTEINS], tmp_path / "b", 2, store=store)
    damaged = read_shard(tmp_path / "a" / f"{parts[0].stem}.tsv")
    assert plan["computed"] == len(damaged.keys)
    assert not parts[0].exists() and parts[0].with_suffix(".h5.corrupt").exists()
    assert parts[1].exists()


def test_ids_with_quotes_and_tabs_in_headers_survive_the_shard_files(tmp_path):
    (header, seq), second = read_records(PROTEINS)[:2]
    fasta = tmp_path / "in.fasta"
    fasta.write_text(f'>it\'s"q"\tdescription\twith tabs\n{seq}\n{second[0]}\n{second[1]}\n')
    plan = plan_shards([fasta], tmp_path / "shards", 1)
    shard = read_shard(tmp_path / "shards" / f"{plan['shards'][0]['shard']}.tsv")
    assert shard.ids[0] == 'it\'s"q"' and shard.sequences == [seq, second[1]]


def test_duplicate_ids_across_files_name_both_places(tmp_path):
    header, seq = read_records(PROTEINS)[5]
    second = tmp_path / "second.fasta"
    second.write_text(f"{header}\n{seq}\n")
    with pytest.raises(FastaError) as err:
        plan_shards([PROTEINS, second], tmp_path / "shards", 2)
    message = str(err.value)
    assert "duplicate" in message and header[1:].split()[0] in message
    assert f"{PROTEINS}:" in message and f"{second}:1" in message
    assert list(tmp_path.iterdir()) == [second]  # nothing written, no spool left


def test_every_input_problem_comes_in_one_message_the_unusable_file_first(tmp_path):
    """A real nucleotide file whose IDs are not unique: the user learns both at once, that it
    is DNA first."""
    nucleotide = tmp_path / "genes.ffn"
    records = read_records(NUCLEOTIDE)
    nucleotide.write_text("".join(f"{h}\n{s}\n" for h, s in records + records[3:4]))
    with pytest.raises(FastaError) as err:
        plan_shards([nucleotide], tmp_path / "shards", 2)
    message = str(err.value)
    assert message.startswith("the input has 2 kinds of problem")
    dup = records[3][0][1:].split()[0]
    assert message.index("nucleotide sequences where proteins") < message.index("duplicate IDs")
    assert f"{nucleotide}: 11 records" in message
    assert f"duplicate IDs (1 ID): '{dup}' at {nucleotide}:7 and at {nucleotide}:21" in message


def test_three_kinds_of_problems_in_one_file_are_all_named(tmp_path):
    longest = max(read_records(PROTEINS), key=lambda r: len(r[1]))
    proteins = [r for r in read_records(PROTEINS) if len(r[1]) <= 1022]
    bad = tmp_path / "bad.fasta"
    bad.write_text(
        "".join(f"{h}\n{s}\n" for h, s in proteins[:3])
        + ">empty no residues\n"  # line 7
        + f"{proteins[1][0]}\n{proteins[1][1]}\n"  # line 8: a duplicate ID
        + f">long {longest[0][1:]}\n{longest[1]}\n"  # line 10: too long
    )
    with pytest.raises(FastaError) as err:
        plan_shards([bad], tmp_path / "shards", 1, long_sequences="fail")
    message = str(err.value)
    assert message.startswith("the input has 3 kinds of problem")
    assert f"records that cannot be read (1 record): {bad}:7: record 'empty" in message
    assert f"duplicate IDs (1 ID): '{proteins[1][0][1:].split()[0]}' at {bad}:3" in message
    assert f"(1 sequence): long ({len(longest[1])} residues > 1022, {bad}:10)" in message
    assert list(tmp_path.iterdir()) == [bad]


def test_a_file_that_is_not_fasta_is_named_and_the_others_still_read(tmp_path):
    genbank = tmp_path / "plasmid.gb"
    genbank.write_text("LOCUS       NC_005816\nORIGIN\n        1 tgtaacgaac\n//\n")
    nucleotide = tmp_path / "genes.ffn"
    nucleotide.write_text(NUCLEOTIDE.read_text())
    with pytest.raises(FastaError) as err:
        plan_shards([genbank, nucleotide], tmp_path / "shards", 1)
    message = str(err.value)
    assert f"files that cannot be read as FASTA (1 file): {genbank}:1: text before" in message
    assert f"{nucleotide}: 10 records" in message


def test_nucleotide_file_is_refused_naming_file_and_count(tmp_path):
    with pytest.raises(FastaError) as err:
        plan_shards([PROTEINS, NUCLEOTIDE], tmp_path / "shards", 2)
    message = str(err.value)
    assert f"{NUCLEOTIDE}: 10 records" in message and "nucleotide_check: false" in message
    assert str(PROTEINS) not in message
    assert list(tmp_path.iterdir()) == []


def test_nucleotide_check_can_be_switched_off(tmp_path):
    plan = plan_shards([NUCLEOTIDE], tmp_path, 1, nucleotide_check=False)
    assert plan["shards"][0]["n_sequences"] == 10


def test_a_disk_without_room_for_the_shards_is_refused_before_reading(tmp_path):
    with small_disk(tmp_path / "disk", 1) as disk:
        fill(disk, PROTEINS.stat().st_size)  # room for one copy of the input, not two
        with pytest.raises(
            DiskFullError, match=f"no space left for {disk / 'shards'}: it needs about"
        ):
            plan_shards([PROTEINS], disk / "shards", 2)
        assert sorted(os.listdir(disk)) == ["filler"]


def test_ids_whose_hashes_collide_are_not_duplicates(tmp_path, monkeypatch):
    def collide(ids):  # every ID's hash is 7
        return np.full(len(ids), 7, dtype=np.uint64)

    monkeypatch.setattr("esmshard.steps.shard.id_hashes", collide)
    monkeypatch.setattr("esmshard.input.scan.id_hashes", collide)
    plan = plan_shards([PROTEINS], tmp_path / "shards", 2)
    assert sum(p["n_sequences"] for p in plan["shards"]) == len(read_records(PROTEINS))
    header, seq = read_records(PROTEINS)[5]
    second = tmp_path / "second.fasta"
    second.write_text(f"{header}\n{seq}\n")
    with pytest.raises(
        FastaError, match=f"duplicate ID '{header[1:].split()[0]}': at {PROTEINS}:"
    ):
        plan_shards([PROTEINS, second], tmp_path / "again", 2)


def test_too_long_records_are_named_up_to_twenty_and_counted(tmp_path):
    header, seq = max(read_records(PROTEINS), key=lambda r: len(r[1]))
    fasta = tmp_path / "long.fasta"
    fasta.write_text("".join(f">long{i}\n{seq}\n" for i in range(25)))
    with pytest.raises(FastaError) as err:
        plan_shards([fasta], tmp_path / "shards", 1, 100, long_sequences="fail")
    message = str(err.value)
    assert "- sequences longer than truncation_seq_length, with long_sequences: fail " in message
    assert "(25 sequences): " in message
    assert f"long4 ({len(seq)} residues > 100, {fasta}:9)" in message and "long5" not in message
    assert "and 20 more" in message
