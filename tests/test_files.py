import os

import pytest

from esmshard.files import atomic_path, read_tsv, write_json, write_tsv


def test_a_failed_write_leaves_neither_the_file_nor_its_temporary(tmp_path):
    target = tmp_path / "out.json"
    with pytest.raises(RuntimeError):
        with atomic_path(target) as tmp:
            tmp.write_text("half")
            raise RuntimeError("disk full")
    assert list(tmp_path.iterdir()) == []


def test_temporary_names_belong_to_their_writer(tmp_path):
    with atomic_path(tmp_path / "x") as tmp:
        assert str(os.getpid()) in tmp.name and tmp.parent == tmp_path
        tmp.write_text("whole")
    assert (tmp_path / "x").read_text() == "whole"


def test_tsv_and_json_round_trip(tmp_path):
    write_tsv(tmp_path / "t.tsv", ["a", "b"], [[1, "x\ty"], [2, "z"]])
    assert read_tsv(tmp_path / "t.tsv") == [{"a": "1", "b": "x\ty"}, {"a": "2", "b": "z"}]
    write_json(tmp_path / "m.json", {"k": 1})
    assert (tmp_path / "m.json").read_text() == '{\n  "k": 1\n}\n'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.json", "t.tsv"]
