"""The variants step's Parquet dataset, read as the catalogues are: one protein's rows found by
the row groups' statistics on `id`, without reading the others."""

import numpy as np
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from esmshard.outputs import variants


def test_rows_in_order_of_id_let_one_proteins_rows_be_found_by_row_group(tmp_path, monkeypatch):
    monkeypatch.setattr(variants, "ROWS_PER_GROUP", 100)
    writer = variants.ScoreWriter(tmp_path / "v.tsv", tmp_path / "v", ["id", "mutant"],
                                  variants.column_types(["id", "mutant"], []),
                                  ["wt_marginals"], {"model": "m"})  # fmt: skip
    ids = [f"P{k:05d}" for k in range(40)]
    for id_ in ids:  # in order of ID, as the step writes them; 57 rows each
        cells = [(id_, f"A{p}C") for p in range(1, 58)]
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
