"""Real-world FASTA: every case reads to the right records, or fails naming file and line."""
import gzip

import pytest

from esmshard.fasta import normalise, read_fasta

from conftest import DATA, PROTEINS, REPO, read_records

ECOLI = read_records(PROTEINS)[:5]


def fasta_text(records, eol="\n", width=60, between=""):
    lines = []
    for header, seq in records:
        lines.append(header)
        lines.extend(seq[i:i + width] for i in range(0, len(seq), width))
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


def test_gzip(tmp_path):
    path = tmp_path / "p.fasta.gz"
    with gzip.open(path, "wb") as fh:
        fh.write(PROTEINS.read_bytes())
    assert sequences(path) == plain(read_records(PROTEINS))


def test_windows_line_endings(tmp_path):
    assert sequences(write(tmp_path / "p.fa", fasta_text(ECOLI, eol="\r\n"))) == plain(ECOLI)


def test_blank_lines_between_records(tmp_path):
    assert sequences(write(tmp_path / "p.fa", "\n" + fasta_text(ECOLI, between="\n"))) == plain(ECOLI)


def test_no_newline_at_end_of_file(tmp_path):
    assert sequences(write(tmp_path / "p.fa", fasta_text(ECOLI).rstrip("\n"))) == plain(ECOLI)


def test_lowercase_residues_and_stretches(tmp_path):
    variants = [(h, s.lower()) for h, s in ECOLI[:2]] + [(h, s[:10] + s[10:30].lower() + s[30:]) for h, s in ECOLI[2:]]
    records = list(read_fasta(write(tmp_path / "p.fa", fasta_text(variants))))
    assert [r.sequence for r in records] == plain(ECOLI)
    assert all(r.n_replaced == 0 for r in records)


def test_terminal_stop_from_gene_caller():
    path = DATA / "phix174_prodigal.faa"
    raw = read_records(path)
    records = list(read_fasta(path))
    assert [r.sequence for r in records] == [s.rstrip("*") for _, s in raw]
    assert records[0].id == "NC_001422.1_1" and "partial=00" in records[0].header


def test_real_nonstandard_letters_u_and_x_are_kept():
    records = list(read_fasta(DATA / "ecoli_nonstandard.fasta"))
    assert [r.sequence for r in records] == plain(read_records(DATA / "ecoli_nonstandard.fasta"))
    assert "U" in records[2].sequence and all(r.n_replaced == 0 for r in records)


@pytest.mark.parametrize("letter, becomes", [("B", "B"), ("Z", "Z"), ("O", "O"), ("U", "U"), ("X", "X"), ("J", "X")])
def test_ambiguity_letters_in_and_outside_the_alphabet(letter, becomes):
    seq = ECOLI[0][1]
    out, replaced = normalise(seq[:20] + letter + seq[21:], "p.fa:1")
    assert out == seq[:20] + becomes + seq[21:]
    assert replaced == (letter != becomes)


def test_alignment_gaps_are_removed():
    path = DATA / "lysozyme_aligned.fasta"
    assert sequences(path) == [s.replace("-", "") for _, s in read_records(path)]


def test_very_long_record():
    (record,) = read_fasta(DATA / "r1ab_sars2.fasta")
    assert len(record.sequence) == 7096 and record.id == "sp|P0DTD1|R1AB_SARS2|YP_009724389.1"


def test_unwrapped_and_mixed_width(tmp_path):
    text = fasta_text(ECOLI[:2], width=10**6) + fasta_text(ECOLI[2:3], width=17) + fasta_text(ECOLI[3:], width=80)
    assert sequences(write(tmp_path / "p.fa", text)) == plain(ECOLI)


def test_header_with_gt_inside_and_trailing_spaces(tmp_path):
    header, seq = ECOLI[0]
    (record,) = read_fasta(write(tmp_path / "p.fa", f"{header} >alt name   \n{seq}  \n"))
    assert record.id == header[1:].split()[0]
    assert record.header == f"{header[1:]} >alt name" and record.sequence == seq


def test_ids_with_quotes_shell_metacharacters_and_slashes(tmp_path):
    names = ["it's\"q\"", "$HOME;rm", "a|b`c`", "../../etc/x"]
    records = [(f">{n} {h[1:]}", s) for n, (h, s) in zip(names, ECOLI)]
    assert [r.id for r in read_fasta(write(tmp_path / "p.fa", fasta_text(records)))] == names


def test_record_of_tens_of_thousands_of_residues(tmp_path):
    """No natural protein that long is in the test data: the real E. coli records joined end to end."""
    joined = "".join(seq for _, seq in read_records(REPO / "config" / "example" / "ecoli_k12_sample.fasta"))[:35_000]
    assert len(joined) == 35_000
    path = write(tmp_path / "long.fa", fasta_text([(">joined_ecoli_records", joined)], width=60)
                 + fasta_text([(">unwrapped", joined)], width=10**6))
    assert [len(s) for s in sequences(path)] == [len(joined), len(joined)]
