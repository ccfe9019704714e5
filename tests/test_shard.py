import pytest

from esmshard.fasta import FastaError
from esmshard.shard import assign, auto_shard_count, estimated_cost, read_tsv, write_shards

from conftest import PROTEINS, read_records


def test_assignment_balances_cost_deterministically():
    lengths = [len(seq) for _, seq in read_records(PROTEINS)]
    costs = [estimated_cost(min(n, 1022), 320) for n in lengths]
    shard_of = assign(costs, 4)
    assert shard_of == assign(costs, 4)
    loads = [sum(c for c, s in zip(costs, shard_of) if s == k) for k in range(4)]
    # LPT bound: no shard exceeds the mean by more than the costliest record.
    assert max(loads) - sum(loads) / 4 <= max(costs)
    assert max(loads) / min(loads) < 1.2


def test_cost_grows_faster_than_length():
    assert estimated_cost(1000, 320) > 10 * estimated_cost(100, 320)


def test_auto_shard_count_depends_on_size_alone():
    assert auto_shard_count(50_000) == 1
    assert auto_shard_count(1_400_000) == 7
    assert auto_shard_count(200_000_000) == 64
    assert auto_shard_count(15_000_000_000) == 1500
    counts = [auto_shard_count(n) for n in range(0, 10**9, 10**7)]
    assert counts == sorted(counts)


def test_write_shards_partitions_every_record(tmp_path):
    plan = write_shards([PROTEINS], tmp_path, 3, 1022, 320)
    records = read_tsv(tmp_path / "records.tsv")
    assert [r["id"] for r in records] == [h[1:].split()[0] for h, _ in read_records(PROTEINS)]
    in_shards = {}
    for p in plan:
        rows = read_tsv(tmp_path / f"{p['shard']}.tsv")
        assert len(rows) == p["n_sequences"]
        in_shards.update({int(r["index"]): r["sequence"] for r in rows})
    assert sorted(in_shards) == list(range(len(records)))
    assert [in_shards[i] for i in range(len(records))] == [s for _, s in read_records(PROTEINS)]
    assert sum(r["truncated"] == "1" for r in records) == 3
    assert not list(tmp_path.glob(".*tmp"))


def test_duplicate_ids_across_files_name_both_places(tmp_path):
    header, seq = read_records(PROTEINS)[5]
    second = tmp_path / "second.fasta"
    second.write_text(f"{header}\n{seq}\n")
    with pytest.raises(FastaError) as err:
        write_shards([PROTEINS, second], tmp_path / "shards", 2, 1022, 320)
    message = str(err.value)
    assert "duplicate" in message and header[1:].split()[0] in message
    assert f"{PROTEINS}:" in message and f"{second}:1" in message
    assert not (tmp_path / "shards" / "records.tsv").exists()


@pytest.mark.parametrize("length", [5, 1022, 1023, 2358, 7096, 30000])
def test_chunk_windows_cover_every_residue_once(length):
    from esmshard.shard import chunk_spans

    spans = chunk_spans(length, 1022)
    assert spans[0][2] == 0 and spans[-1][3] == length
    for (a, b, keep_from, keep_to), following in zip(spans, spans[1:] + [None]):
        assert b - a <= 1022 and a <= keep_from < keep_to <= b
        if following:
            assert keep_to == following[2]  # kept parts tile the sequence
            assert b - following[0] >= 1022 // 4  # windows overlap by at least a quarter
