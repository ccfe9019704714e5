"""The shard step's first pass in pieces (esmshard.input.scan): the same records, lines,
problems and plan whatever the number of workers."""

import gzip

import pandas as pd
import pytest
from helpers import PROTEINS, PROTEOME, plan_shards, read_records

from esmshard.input.fasta import FastaError, read_raw
from esmshard.input.scan import pieces


@pytest.fixture
def small_pieces(monkeypatch):
    """Pieces of 4 KB, so that the test files are cut into many."""
    monkeypatch.setattr("esmshard.input.scan.PIECE_BYTES", 4096)


def records_of(path, part=None):
    return [(r.id, r.line, r.sequence, r.n_replaced) for r in read_raw(path, part=part)]


def test_the_pieces_of_a_file_hold_its_records_at_their_lines(tmp_path, small_pieces):
    # a byte-order mark, CRLF line ends, blank lines and wrapped sequences
    lines = ["\ufeff"]
    for header, sequence in read_records(PROTEOME)[:60]:
        lines += [header, "", *(sequence[k : k + 60] for k in range(0, len(sequence), 60))]
    fasta = tmp_path / "wrapped.fasta"
    fasta.write_bytes("\r\n".join(lines).encode())
    found = pieces([fasta], workers=3)
    assert len(found) == 6 and all(p.part for p in found)
    assert [p.part.start for p in found[1:]] == [p.part.end for p in found[:-1]]
    in_pieces = [r for p in found for r in records_of(p.path, p.part)]
    assert in_pieces == records_of(fasta)


def test_compressed_and_small_files_are_one_piece_each(tmp_path, small_pieces):
    packed = tmp_path / "proteins.fasta.gz"
    packed.write_bytes(gzip.compress(PROTEOME.read_bytes()))
    found = pieces([packed, PROTEINS], workers=2)
    assert [(p.number, p.part) for p in found][0] == (0, None)
    assert {p.number for p in found[1:]} == {1} and len(found) > 2
    assert pieces([PROTEOME], workers=1)[0].part is None


def same_plan(first, second):
    """Two shard steps' outputs agree: every record's row, and each shard's sequences."""
    tables = [pd.read_parquet(d / "records.parquet") for d in (first, second)]
    names = [sorted(t["shard"].unique()) for t in tables]
    for table, shard_names in zip(tables, names):
        table["shard"] = table["shard"].map({n: k for k, n in enumerate(shard_names)})
    pd.testing.assert_frame_equal(*tables)
    for a, b in zip(*names):
        assert (first / f"{a}.tsv").read_text() == (second / f"{b}.tsv").read_text()


def test_two_workers_plan_what_one_plans(tmp_path, small_pieces):
    # some sequences again under other IDs: compressed (one piece), and plain
    again = tmp_path / "again.fasta.gz"
    again.write_bytes(gzip.compress(PROTEINS.read_bytes().replace(b">", b">again_")))
    plain = tmp_path / "plain.fasta"
    plain.write_bytes(PROTEINS.read_bytes().replace(b">", b">plain_"))
    inputs = [PROTEOME, again, plain]
    one = plan_shards(inputs, tmp_path / "one", 3, store=tmp_path / "store1")
    two = plan_shards(inputs, tmp_path / "two", 3, store=tmp_path / "store2", workers=2)
    assert len(pieces(inputs, 2)) > 4  # the plain files in pieces, in worker processes
    n_records = len(read_records(PROTEOME)) + 2 * len(read_records(PROTEINS))
    assert one["records"] == two["records"] == n_records
    assert one["computed"] == two["computed"] == len({s for _, s in read_records(PROTEOME)})
    assert one["long_said"] == two["long_said"] and one["long_records"] > 0
    same_plan(tmp_path / "one", tmp_path / "two")


def test_problems_in_several_pieces_are_told_as_one_worker_tells_them(tmp_path, small_pieces):
    records = read_records(PROTEOME)[:200]
    records[10] = (records[10][0], "")  # no residues
    records[150] = (records[150][0], records[150][1][:5] + "!" + records[150][1][5:])
    records[180] = (records[3][0], records[180][1])  # the ID of record 3 again
    fasta = tmp_path / "bad.fasta"
    fasta.write_text("".join(f"{h}\n{s}\n" for h, s in records))
    said = []
    for workers in (1, 2):
        with pytest.raises(FastaError) as err:
            plan_shards([fasta], tmp_path / f"w{workers}", 2, workers=workers)
        said.append(str(err.value))
    assert said[0] == said[1]
    assert "2 records" in said[0] and f"{fasta}:21:" in said[0] and "duplicate ID" in said[0]
    assert not list(tmp_path.glob("w*"))  # nothing is left of either step


def test_a_reading_process_killed_is_one_line_saying_to_run_again(tmp_path):
    import subprocess

    from esmshard.input.fasta import FilePart
    from esmshard.input.scan import Piece, ReaderStopped, _finish

    process = subprocess.Popen(["sleep", "60"])  # a worker, killed as the system would
    process.kill()
    piece = Piece(0, "proteome.fasta", FilePart(1 << 20, 2 << 20, 17000))
    (tmp_path / "stderr").write_text("")
    with pytest.raises(ReaderStopped) as stopped:
        _finish(process, piece, tmp_path)
    assert str(stopped.value) == (
        f"the process reading proteome.fasta from byte {1 << 20} (process {process.pid}) was "
        "stopped by SIGKILL (by hand, or by the system for memory): nothing of the shard step "
        "was written; run the same command again"
    )
