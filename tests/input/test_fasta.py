"""Real-world FASTA: every case reads to the right records, or fails naming the file and line."""

import bz2
import gzip
import lzma
import re

import pytest
from helpers import (
    ALIGNED,
    GENE_CALLER,
    LONG_PROTEIN,
    NONSTANDARD,
    NUCLEOTIDE,
    PROTEINS,
    PROTEOME,
    read_records,
)

from esmshard.input.fasta import (
    FastaError,
    looks_nucleotide,
    normalise,
    printable,
    read_fasta,
    read_raw,
)

RECORDS = read_records(PROTEINS)
ECOLI = RECORDS[:5]


def fasta_text(records, eol="\n", width=60, between=""):
    lines = []
    for header, seq in records:
        lines.append(header)
        lines.extend(seq[i : i + width] for i in range(0, len(seq), width))
        if between:
            lines.append(between)
    return eol.join(lines) + eol


def write(path, text):
    path.write_bytes(text.encode())
    return path


def sequences(path):
    return [r.sequence for r in read_fasta(path)]


def plain(records):
    return [seq for _, seq in records]


def test_reads_real_proteome_slice():
    records = list(read_fasta(PROTEINS))
    assert len(records) == len(RECORDS) == 40
    assert [r.sequence for r in records] == plain(RECORDS)
    assert records[0].header == RECORDS[0][0][1:]
    assert records[0].id == RECORDS[0][0][1:].split()[0]
    second_header_line = 2 + (len(RECORDS[0][1]) + 59) // 60
    assert records[1].source == f"{PROTEINS}:{second_header_line}"


@pytest.mark.parametrize("opener", [gzip.open, bz2.open, lzma.open], ids=["gzip", "bzip2", "xz"])
def test_compressed(tmp_path, opener):
    path = tmp_path / "p.fasta.compressed"
    with opener(path, "wb") as fh:
        fh.write(PROTEINS.read_bytes())
    assert sequences(path) == plain(RECORDS)


def test_zstd_and_other_formats_are_named(tmp_path):
    zstd = tmp_path / "p.fasta.zst"
    zstd.write_bytes(b"\x28\xb5\x2f\xfd" + b"\x00" * 32)  # a zstd frame's magic number
    with pytest.raises(FastaError, match=f"{zstd}: the file is zstd-compressed .*zstd -d"):
        list(read_fasta(zstd))


def test_truncated_gzip_names_the_file(tmp_path):
    path = tmp_path / "p.fasta.gz"
    path.write_bytes(gzip.compress(PROTEINS.read_bytes())[:5000])
    with pytest.raises(FastaError, match=f"{path}: cannot be read to its end .*truncated"):
        list(read_fasta(path))


def test_utf8_byte_order_mark_is_accepted(tmp_path):
    path = tmp_path / "bom.fasta"
    path.write_bytes(b"\xef\xbb\xbf" + fasta_text(ECOLI).encode())
    assert sequences(path) == plain(ECOLI)
    assert next(read_fasta(path)).id == ECOLI[0][0][1:].split()[0]


@pytest.mark.parametrize(
    "letter", ["\ufb00", "\u0131", "\u017f", "\u00e9"]
)  # ﬀ → FF, ı → I, ſ → S
def test_non_ascii_letters_in_a_sequence_stop_with_file_and_line(tmp_path, letter):
    header, seq = ECOLI[1]
    path = write(tmp_path / "p.fa", fasta_text([ECOLI[0], (header, seq[:30] + letter + seq[30:])]))
    line = 2 + (len(ECOLI[0][1]) + 59) // 60
    with pytest.raises(
        FastaError, match=f"{path}:{line}: character '{letter}' \\(U\\+{ord(letter):04X}\\)"
    ):
        list(read_fasta(path))


def test_bytes_that_are_not_utf8_stop_with_file_and_line(tmp_path):
    header, seq = ECOLI[0]
    path = tmp_path / "latin1.fa"
    path.write_bytes(f"{header}\n{seq[:10]}".encode() + b"\xe9" + f"{seq[10:]}\n".encode())
    with pytest.raises(FastaError, match=f"{path}:1: character"):
        list(read_fasta(path))


def test_windows_line_endings(tmp_path):
    assert sequences(write(tmp_path / "p.fa", fasta_text(ECOLI, eol="\r\n"))) == plain(ECOLI)


def test_blank_lines_between_records(tmp_path):
    assert sequences(write(tmp_path / "p.fa", "\n" + fasta_text(ECOLI, between="\n"))) == plain(
        ECOLI
    )


def test_no_newline_at_end_of_file(tmp_path):
    assert sequences(write(tmp_path / "p.fa", fasta_text(ECOLI).rstrip("\n"))) == plain(ECOLI)


def test_lowercase_residues_and_stretches(tmp_path):
    variants = [(h, s.lower()) for h, s in ECOLI[:2]] + [
        (h, s[:10] + s[10:30].lower() + s[30:]) for h, s in ECOLI[2:]
    ]
    records = list(read_fasta(write(tmp_path / "p.fa", fasta_text(variants))))
    assert [r.sequence for r in records] == plain(ECOLI)
    assert all(r.n_replaced == 0 for r in records)


def test_terminal_stop_from_gene_caller():
    raw = read_records(GENE_CALLER)
    records = list(read_fasta(GENE_CALLER))
    assert sum(s.endswith("*") for _, s in raw) == 25
    assert [r.sequence for r in records] == [s.removesuffix("*") for _, s in raw]
    assert records[0].id == raw[0][0][1:].split()[0] and "(db=kegg)" in records[0].header


def test_real_nonstandard_letters_u_and_x_are_kept():
    records = list(read_fasta(NONSTANDARD))
    assert [r.sequence for r in records] == plain(read_records(NONSTANDARD))
    assert "X" in records[0].sequence and "U" in records[2].sequence
    assert all(r.n_replaced == 0 for r in records)


def test_internal_stop_becomes_x():
    assert normalise("MK*VL", "f:1") == ("MKXVL", 1)


@pytest.mark.parametrize(
    "letter, becomes", [("B", "B"), ("Z", "Z"), ("O", "O"), ("U", "U"), ("X", "X"), ("J", "X")]
)
def test_ambiguity_letters_in_and_outside_the_alphabet(letter, becomes):
    seq = ECOLI[0][1]
    out, replaced = normalise(seq[:20] + letter + seq[21:], "p.fa:1")
    assert out == seq[:20] + becomes + seq[21:]
    assert replaced == (letter != becomes)


def test_alignment_gaps_are_removed():
    raw = read_records(ALIGNED)
    assert any("-" in s for _, s in raw)
    assert sequences(ALIGNED) == [s.replace("-", "") for _, s in raw]


def test_very_long_record():
    (record,) = read_fasta(LONG_PROTEIN)
    assert len(record.sequence) == 7096 and record.id == "sp|P0DTD1|R1AB_SARS2|YP_009724389.1"


def test_unwrapped_and_mixed_width(tmp_path):
    text = (
        fasta_text(ECOLI[:2], width=10**6)
        + fasta_text(ECOLI[2:3], width=17)
        + fasta_text(ECOLI[3:], width=80)
    )
    assert sequences(write(tmp_path / "p.fa", text)) == plain(ECOLI)


def test_header_with_gt_inside_and_trailing_spaces(tmp_path):
    header, seq = ECOLI[0]
    (record,) = read_fasta(write(tmp_path / "p.fa", f"{header} >alt name   \n{seq}  \n"))
    assert record.id == header[1:].split()[0]
    assert record.header == f"{header[1:]} >alt name" and record.sequence == seq


def test_ids_with_quotes_shell_metacharacters_and_slashes(tmp_path):
    names = ['it\'s"q"', "$HOME;rm", "a|b`c`", "../../etc/x"]
    records = [(f">{n} {h[1:]}", s) for n, (h, s) in zip(names, ECOLI)]
    assert [r.id for r in read_fasta(write(tmp_path / "p.fa", fasta_text(records)))] == names


def test_record_of_tens_of_thousands_of_residues(tmp_path):
    """No natural protein that long is in the test data: the real E. coli records joined end to end."""
    joined = "".join(plain(read_records(PROTEOME)))[:35_000]
    path = write(
        tmp_path / "long.fa",
        fasta_text([(">joined_ecoli_records", joined)], width=60)
        + fasta_text([(">unwrapped", joined)], width=10**6),
    )
    assert [len(s) for s in sequences(path)] == [35_000, 35_000]


def test_nucleotide_records_are_recognised():
    nucleotide = list(read_fasta(NUCLEOTIDE))
    assert len(nucleotide) == 10 and all(looks_nucleotide(r.sequence) for r in nucleotide)
    assert not any(looks_nucleotide(r.sequence) for r in read_fasta(PROTEOME))


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


@pytest.mark.parametrize("eol", ["\n", "\r\n"])
@pytest.mark.parametrize("block", [1, 7, 64, 1000])
def test_records_across_block_boundaries_read_the_same(tmp_path, monkeypatch, eol, block):
    """Blocks of a few bytes put every boundary everywhere: inside headers, sequences, CRLFs."""
    path = write(tmp_path / "p.fa", "\n" + fasta_text(RECORDS[:12], eol=eol, between=eol))
    whole = list(read_fasta(path))
    monkeypatch.setattr("esmshard.input.fasta._BLOCK_BYTES", block)
    assert list(read_fasta(path)) == whole
    assert [r.sequence for r in whole] == plain(RECORDS[:12])
    # a blank line first, and two after each record (`between` is a line end of its own)
    assert whole[1].source == f"{path}:{5 + (len(RECORDS[0][1]) + 59) // 60}"


@pytest.mark.parametrize(
    "record, message",
    [
        (b">a x\x00y\nMKV\n", "1: the header holds a NUL byte (0x00); remove it"),
        (b">a\nMK\x00V\n", "1: the sequence holds a NUL byte (0x00); remove it"),
        (b">a\x1b[31m red\nMKV\n", "1: the header holds a control character (0x1b); remove it"),
        (b">a\nMK\x0bV\n", "1: the sequence holds a control character (0x0b); remove it"),
        (
            ">a\u009b31m\nMKV\n".encode(),
            "1: the header holds a control character (U+009B); remove",
        ),
        (b">a hdr\rMKVL\n", "1: the header holds a carriage return (CR) inside a line; give"),
        (b">a\nMK\rVL\n", "1: the sequence holds a carriage return (CR) inside a line; give"),
    ],
)
def test_control_characters_and_a_lone_cr_stop_with_file_and_line(tmp_path, record, message):
    path = tmp_path / "x.fasta"
    path.write_bytes(record + b">b\tfine\tdescription\nMKVLA\r\n")
    with pytest.raises(FastaError, match=re.escape(f"{path}:{message}")):
        list(read_fasta(path))
    path.write_bytes(b">b\tfine\tdescription\nMKVLA\r\n")  # a tab in a header and CRLF are fine
    assert [(r.id, r.sequence) for r in read_fasta(path)] == [("b", "MKVLA")]


def test_printable_escapes_what_a_terminal_would_act_on():
    assert printable("P1\x1b[31m\u009b2J\rx\x7f") == "P1\\x1b[31m\\x9b2J\\rx\\x7f"
    assert printable("sp|P12345|Ünïcode_ID\tdesc") == "sp|P12345|Ünïcode_ID\tdesc"


def test_a_header_that_is_not_utf8_is_refused_by_file_and_line_not_replaced(tmp_path):
    # Latin-1 IDs: replaced by U+FFFD they would be other IDs, and two different ones one ID.
    path = tmp_path / "latin1.fasta"
    path.write_bytes(b">caf\xe9 one\nMKVLA\n>ok\nMSTNP\n>caf\xe8 two\nMKKLL\n")
    bad = []
    kept = [r.id for r in read_raw(str(path), on_bad_record=bad.append)]
    assert kept == ["ok"]
    assert [str(e) for e in bad] == [
        f"{path}:{line}: the header is not UTF-8 text (byte 0x{byte:02x} at column 5); convert "
        "the file to UTF-8 (e.g. iconv -f latin1 -t utf-8)"
        for line, byte in ((1, 0xE9), (5, 0xE8))
    ]
