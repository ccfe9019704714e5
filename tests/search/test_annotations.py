"""Reading the reference's annotations: wide and long form, Excel's and GOA's files, the tables'
own column names kept, and a file that is not one said in one line naming it."""

import pytest

from esmshard.search.annotations import AnnotationsError, read_annotations, unmatched_line


def written(tmp_path, data: bytes, name="ann.csv"):
    path = tmp_path / name
    path.write_bytes(data)
    return path


def test_long_form_keeps_every_row_of_an_id(tmp_path):
    path = written(tmp_path, b"id\tgo\tname\nP1\tGO:1\tkinase\nP1\tGO:2\tkinase\nP2\tGO:3\tx\n"
                   b"P1\tGO:1\tkinase\n", "goa.tsv")  # fmt: skip
    assert read_annotations(path) == {
        "P1": {"go": "GO:1;GO:2", "name": "kinase"},
        "P2": {"go": "GO:3", "name": "x"},
    }


def test_the_tables_own_column_names_are_carried_prefixed(tmp_path):
    path = written(tmp_path, b"rank,id,distance,neighbour,annotation_rank\nspecies,P1,3,Q,y\n")
    assert read_annotations(path) == {
        "P1": {"annotation_rank": "species", "annotation_distance": "3",
               "annotation_neighbour": "Q", "annotation_annotation_rank": "y"}
    }  # fmt: skip


def test_a_byte_order_mark_is_read_as_excel_writes_it(tmp_path):
    path = written(tmp_path, "\ufeffid,ec\nP1,3.1.1.1\n".encode())
    assert read_annotations(path) == {"P1": {"ec": "3.1.1.1"}}


@pytest.mark.parametrize(
    "data, said",
    [
        (b"id,name\nP1,caf\xe9\n", r"ann.csv:2: byte 14 \(0xe9\) is not UTF-8: save the file as "
         r"UTF-8 \(in Excel: CSV UTF-8\)"),
        (b"\xef\xbb\xbfid,name\nP1,caf\xe9\n", "ann.csv:2: byte 17 "),
        (b"id,ec\n", "ann.csv holds a header but no rows: give the reference proteins' "),
        (b"", "ann.csv is empty: give a CSV or TSV with an `id` column"),
        (b"accession,ec\nP1,1\n", r"ann.csv: no `id` column in its header \(accession, ec\): "
         "name the column of the reference's IDs `id`"),
    ],
)  # fmt: skip
def test_a_file_that_is_not_annotations_is_said_in_one_line(tmp_path, data, said):
    with pytest.raises(AnnotationsError, match=said):
        read_annotations(written(tmp_path, data))


def test_the_head_alone_is_enough_to_check_a_file(tmp_path):
    rows = "".join(f"P{n},{'é' * 7}\n" for n in range(20_000))
    path = written(tmp_path, f"id,name\n{rows}".encode())
    head = read_annotations(path, head=True)
    assert 0 < len(head) < 20_000 and all(v == {"name": "é" * 7} for v in head.values())
    assert len(read_annotations(path)) == 20_000


def test_annotated_ids_absent_from_the_reference_are_counted_in_one_line():
    annotations = {"P1": {"go": "a"}, "X9": {"go": "b"}, "X8": {"go": "c"}}
    line = unmatched_line(annotations, ["P1", "P2"], "go.tsv", "ref.h5")
    assert line == "2 of the 3 IDs of go.tsv are not in ref.h5 (e.g. X9): they carry nothing over"
    assert unmatched_line(annotations, ["X8", "X9", "P1"], "go.tsv", "ref.h5") is None
