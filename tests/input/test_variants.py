"""The variants table: fair-esm's predict.py and ProteinGym's `mutant` convention, and one line
per problem naming the table's file and line."""

import pytest
from helpers import PROTEINS, read_records

from esmshard.input.variants import Substitution, parse_mutant, problems, read_table

RECORDS = read_records(PROTEINS)
ID, SEQUENCE = RECORDS[0][0][1:].split()[0], RECORDS[0][1]


def test_a_mutant_is_its_substitutions():
    assert parse_mutant("H24C") == (Substitution("H", 24, "C"),)
    assert parse_mutant(" h24c:G45D ") == (Substitution("H", 24, "C"), Substitution("G", 45, "D"))
    assert parse_mutant("K17*") == (Substitution("K", 17, "*"),)  # a stop-gain


@pytest.mark.parametrize(
    "text, said",
    [
        ("24C", "not written as"),
        ("H24", "not written as"),
        ("H24C;G45D", "not written as"),
        ("H24B", "B is not one of the 20 amino acids"),
        ("X3A", "X is not one of the 20"),
        ("H0C", "count from 1"),
        ("H24C:H24D", "changes one position twice"),
        ("K17*:G45D", "a stop-gain \\(K17\\*\\) ends the protein: write it on a line of its own"),
        ("*17K", "not written as"),
    ],
)
def test_a_mutant_written_wrong_is_named(text, said):
    with pytest.raises(ValueError, match=said):
        parse_mutant(text)


def table(tmp_path, text, name="variants.csv"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_csv_and_tsv_tables_are_read_with_their_other_columns_kept(tmp_path):
    for name, sep in (("v.csv", ","), ("v.tsv", "\t")):
        path = table(tmp_path, f"id{sep}mutant{sep}DMS_score\nP1{sep}M1A{sep}0.5\n", name)
        table_read, found = read_table(path)
        (variant,) = table_read.variants
        assert found == [] and variant.id == "P1" and variant.mutant == "M1A"
        assert table_read.columns == ["id", "mutant", "DMS_score"]
        assert variant.cells == ("P1", "M1A", "0.5")
        assert variant.where == f"{path}:2"


def test_every_problem_of_a_table_is_one_line_naming_its_line(tmp_path):
    wild = SEQUENCE[9]
    other = next(a for a in "ACDEFGHIKLMNPQRSTVWY" if a != wild)
    path = table(
        tmp_path,
        "id,mutant\n"
        f"{ID},{wild}10A\n"  # fine
        f"{ID},{other}10A\n"  # not the record's residue
        f"{ID},{wild}{len(SEQUENCE) + 1}A\n"  # beyond the record
        f"{ID},{wild}10J\n"  # not an amino acid
        f"nosuchid,{wild}10A\n",
    )
    found = problems(path, [PROTEINS], 1022)
    assert len(found) == 4  # how it is written first, then how it fits the records
    assert f"{path}:5:" in found[0] and "J is not one of the 20 amino acids" in found[0]
    assert f"{path}:3: {other}10A: the record has {wild} at 10, not {other}" in found[1]
    assert f"{path}:4:" in found[2] and f"beyond the {len(SEQUENCE)} residues" in found[2]
    assert f"{path}:6: no input record has the ID 'nosuchid'" in found[3]
    assert all("\n" not in line for line in found)


def test_a_position_beyond_the_residues_embedded_names_truncation(tmp_path):
    path = table(tmp_path, f"id,mutant\n{ID},{SEQUENCE[20]}21A\n")
    (line,) = problems(path, [PROTEINS], 20)
    assert line.endswith(
        ": position 21 is beyond the 20 residues embedded (truncation_seq_length; "
        "long_sequences: chunk scores every residue of a longer protein)"
    ), line


def test_without_an_id_column_the_input_must_hold_one_record(tmp_path):
    path = table(tmp_path, f"mutant\n{SEQUENCE[0]}1A\n")
    (line,) = problems(path, [PROTEINS], 1022)
    assert "no `id` column" in line
    one = tmp_path / "one.fasta"
    one.write_text(f">{ID}\n{SEQUENCE}\n")
    assert problems(path, [one], 1022) == []


def test_a_table_without_mutants_says_what_it_needs(tmp_path):
    (line,) = problems(table(tmp_path, "id,variant\nP1,M1A\n"), [PROTEINS], 1022)
    assert "has no `mutant` column (its columns: id, variant)" in line
    (line,) = problems(tmp_path / "missing.csv", [PROTEINS], 1022)
    assert "missing.csv cannot be read" in line


def test_many_problems_are_counted_after_the_first(tmp_path):
    rows = "".join(f"{ID},Z{k}A\n" for k in range(1, 30))
    found = problems(table(tmp_path, "id,mutant\n" + rows), [PROTEINS], 1022)
    assert len(found) == 6 and found[-1].endswith(
        "and 24 more lines of " + str(tmp_path / "variants.csv")
    )


def test_pseudo_ppls_mutants_are_each_variants_sequence_once_and_counted_before_the_run(tmp_path):
    from esmshard.input.fasta import read_fasta
    from esmshard.input.variants import ALL, mutants_work, write_mutants

    fasta = tmp_path / "p.fasta"
    records = [(h[1:].split()[0], s) for h, s in RECORDS[:2]]
    fasta.write_text("".join(f">{i}\n{s}\n" for i, s in records))
    (first, s1), (second, s2) = records
    table = tmp_path / "v.csv"
    table.write_text(
        f"id,mutant\n{first},{s1[0]}1A\n{second},{s2[2]}3W:{s2[4]}5G\n{first},{s1[0]}1A\n"
    )
    said = mutants_work([fasta], table, 5000)  # no truncation
    written = write_mutants([fasta], table, 5000, tmp_path / "m.fasta")
    got = [(r.id, r.sequence) for r in read_fasta(tmp_path / "m.fasta")]
    assert (
        got
        == [
            (f"{first}/wild_type", s1),  # what pseudo_ppl subtracts
            (f"{first}/{s1[0]}1A", "A" + s1[1:]),
            (f"{second}/wild_type", s2),
            (f"{second}/{s2[2]}3W:{s2[4]}5G", s2[:2] + "W" + s2[3] + "G" + s2[5:]),
        ]
    )  # the repeated line once
    passes = (len(s1) + 1, len(s2) + 1)  # a pass per residue and one unmasked, each
    tokens = 2 * (passes[0] * (len(s1) + 2) + passes[1] * (len(s2) + 2))
    assert said == written == (4, 2 * sum(passes), tokens)
    # every single substitution, truncated as the records are: counted without writing them
    limit = 40
    said = mutants_work([fasta], ALL, limit)
    written = write_mutants([fasta], ALL, limit, tmp_path / "all.fasta")
    got = list(read_fasta(tmp_path / "all.fasta"))
    assert (
        said == written == (len(got), len(got) * (limit + 1), len(got) * (limit + 1) * (limit + 2))
    )
    assert len(got) == 2 * (19 * limit + 1)  # each record's substitutions, and itself
    assert all(len(r.sequence) == limit for r in got) and len({r.id for r in got}) == len(got)


def test_a_table_numbered_from_another_residue_is_read_with_its_offset_or_named_in_one_line(
    tmp_path,
):
    """A table whose residues are numbered from 3 (as TEM-1's Ambler numbering is): read with
    variant_offset=3; with the default, one line naming the offset at which all fit."""
    positions = range(5, min(len(SEQUENCE), 120), 13)  # 0-based, in the record
    rows = "".join(f"{ID},{SEQUENCE[p]}{p + 3}{'A' if SEQUENCE[p] != 'A' else 'C'}\n"
                   for p in positions)  # fmt: skip
    path = table(tmp_path, "id,mutant\n" + rows)
    assert problems(path, [PROTEINS], 1022, offset=3) == []
    (line,) = problems(path, [PROTEINS], 1022)
    n = len(positions)
    assert line == (
        f"variants: {path}: {n} of its {n} variants' wild types are not at the positions "
        "written, and every one is with variant_offset=3 (the table numbers the record's first "
        "residue 3); set variant_offset=3"
    )
    read, found = read_table(path, offset=3)
    assert found == [] and read.variants[0].substitutions[0].position == positions[0] + 1


def test_a_column_named_as_a_strategy_and_a_position_before_the_first_residue_are_named(
    tmp_path,
):
    (line,) = problems(table(tmp_path, "id,mutant,wt_marginals\nP1,M1A,0.1\n"), [PROTEINS], 1022)
    assert "has a column named as a strategy's scores (wt_marginals); rename it" in line
    path = table(tmp_path, f"id,mutant\n{ID},{SEQUENCE[0]}2A\n", "early.csv")
    (line,) = problems(path, [PROTEINS], 1022, offset=3)
    assert (
        line
        == f"variants: {path}:2: position 2 is before the record's first residue, 3 (variant_offset)"
    )
