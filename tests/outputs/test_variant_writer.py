"""The variants step's files: the Parquet dataset read as the catalogues are (one protein's rows
found by the row groups' statistics on `id`, without reading the others), the TSV as csv reads
it, and the counts of its last line."""

import csv

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from esmshard.outputs import variant_writer


def test_rows_in_order_of_id_let_one_proteins_rows_be_found_by_row_group(tmp_path, monkeypatch):
    monkeypatch.setattr(variant_writer, "ROWS_PER_GROUP", 100)
    writer = variant_writer.ScoreWriter(tmp_path / "v.tsv", tmp_path / "v", ["id", "mutant"],
                                  [pa.string(), pa.string()], ["wt_marginals"],
                                  {"model": "m"})  # fmt: skip
    ids = [f"P{k:05d}" for k in range(40)]
    for id_ in ids:  # in order of ID, as the step writes them; 57 rows each
        cells = [pa.array([id_] * 57), pa.array([f"A{p}C" for p in range(1, 58)])]
        writer.write(cells, {"wt_marginals": np.arange(57, dtype=np.float64)})
    writer.close()
    (part,) = sorted((tmp_path / "v").glob("*.parquet"))
    meta = pq.ParquetFile(part).metadata
    bounds = [meta.row_group(g).column(0).statistics for g in range(meta.num_row_groups)]
    assert meta.num_row_groups >= 40 * 57 // 200  # groups of 100 rows or a protein's more
    assert all(a.max <= b.min for a, b in zip(bounds, bounds[1:]))  # they do not overlap
    wanted = ids[17]
    groups = [g for g, b in enumerate(bounds) if b.min <= wanted <= b.max]
    assert len(groups) <= 2  # its 57 rows lie in one group, or two
    fragment = next(iter(ds.dataset(tmp_path / "v").get_fragments()))
    kept = fragment.split_by_row_group(filter=ds.field("id") == wanted)
    assert [f.row_groups[0].id for f in kept] == groups  # the others are never read
    table = pq.read_table(tmp_path / "v", filters=[("id", "=", wanted)])
    assert table.num_rows == 57 and set(table.column("id").to_pylist()) == {wanted}


def test_tsv_quotes_a_block_only_where_a_cell_needs_it_and_reads_back_the_same(tmp_path):
    columns = ["id", "mutant", "note"]
    writer = variant_writer.ScoreWriter(tmp_path / "v.tsv", tmp_path / "v", columns,
                                  [pa.string()] * 3, ["wt_marginals", "masked_marginals"],
                                  {"model": "m"})  # fmt: skip
    plain = [("P1", "A2C", "seen twice"), ("P1", "A2D", "")]
    odd = [("P2", "K5E", 'a "quoted" word'), ("P2", "K5R", "tab\there")]
    scores = {"wt_marginals": np.array([0.1, np.nan]), "masked_marginals": np.array([-2.5, 1e-7])}
    for block in (plain, odd):
        writer.write([pa.array(cells) for cells in zip(*block)], scores)
    writer.close()
    lines = (tmp_path / "v.tsv").read_text().splitlines()
    assert lines[:3] == ["id\tmutant\tnote\twt_marginals\tmasked_marginals",
                         "P1\tA2C\tseen twice\t0.1\t-2.5", "P1\tA2D\t\t\t1e-7"]  # fmt: skip
    with open(tmp_path / "v.tsv", newline="") as fh:
        rows = list(csv.reader(fh, delimiter="\t"))[1:]
    assert [tuple(row[:3]) for row in rows] == plain + odd
    assert [float(row[3] or "nan") for row in rows][2] == np.float32(0.1)
    assert writer.empty == {"wt_marginals": 2, "masked_marginals": 0} and writer.rows == 4
    assert pq.read_table(tmp_path / "v").column("note").to_pylist()[2:] == [c[2] for c in odd]


def test_the_last_line_counts_one_variant_left_without_a_row_in_the_singular():
    counts = {"scored": 4, "strategies": ["wt_marginals"], "of": "variants", "empty": {}}
    one = variant_writer.counts_line({**counts, "without_rows": 1}, "out/variant_scores.tsv")
    two = variant_writer.counts_line({**counts, "without_rows": 2}, "out/variant_scores.tsv")
    assert one == (
        "variants: 4 scored (wt_marginals) in out/variant_scores.tsv; 1 variant has no row: "
        "its record failed (failed_sequences.tsv says why)"
    )
    assert "; 2 variants have no row: their records failed (" in two
