import pytest

from esmshard.fasta import FastaError, normalise, read_fasta

from conftest import PROTEINS, read_records

RECORDS = read_records(PROTEINS)


def write(path, text, mode="w"):
    with open(path, mode, newline="") as fh:
        fh.write(text)
    return path


def test_reads_real_proteome_slice():
    records = list(read_fasta(PROTEINS))
    assert len(records) == len(RECORDS) == 40
    assert [r.sequence for r in records] == [seq for _, seq in RECORDS]
    assert records[0].header == RECORDS[0][0][1:]
    assert records[0].id == RECORDS[0][0][1:].split()[0]
    second_header_line = 2 + (len(RECORDS[0][1]) + 59) // 60
    assert records[1].source == f"{PROTEINS}:{second_header_line}"


def test_internal_stop_becomes_x():
    assert normalise("MK*VL", "f:1") == ("MKXVL", 1)


@pytest.mark.parametrize(
    "text, message",
    [
        ("", "no FASTA records"),
        ("just some text\nand more\n", ":1: text before the first '>' header"),
        (">a\nMKV\n>b\n\n>c\nMKV\n", ":3: record 'b' has no residues"),
        (">a\nMK1V\n", ":1: character '1' is not an amino-acid letter"),
    ],
)
def test_bad_input_names_file_and_line(tmp_path, text, message):
    path = write(tmp_path / "bad.fasta", text)
    with pytest.raises(FastaError) as err:
        list(read_fasta(path))
    assert str(path) in str(err.value) and message in str(err.value)
