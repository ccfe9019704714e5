"""The first lookup by ID in an embeddings.h5 of N rows, through its ID index and without it.

    python benchmarks/lookup.py --rows 2000000 10000000

The file has the layout the merge writes (`ids`, `sequence_sha256`, `lengths`, `mean/1` of
D = 32, and `id_index/*` written by the merge's own `write_id_index`), its IDs and sequences the
E. coli proteome's repeated under new IDs (`t<copy>_<ID>`); the values are zeros, which a lookup
does not read differently. A copy without `id_index` stands for a file of an earlier version.
Each lookup runs in a fresh process (benchmarks/scale.py's `first_lookup`): the last row's ID,
its seconds and the memory it added.
"""

import argparse
import hashlib
import json
import sys
import tempfile
from pathlib import Path

import h5py
import numpy as np

from esmshard.embeddings_h5.id_index import id_hashes, write_id_index

sys.path.insert(0, str(Path(__file__).parent))
from scale import PROTEOME, first_lookup  # noqa: E402

BLOCK = 1 << 18


def proteome() -> list[tuple[str, str]]:
    records = []
    for record in PROTEOME.read_text().lstrip(">").split("\n>"):
        header, *lines = record.split("\n")
        records.append((header.split()[0], "".join(lines)))
    return records


def write_file(path: Path, n_rows: int, records, with_index: bool) -> None:
    ids_of = [id_ for id_, _ in records]
    sha = np.array([hashlib.sha256(s.encode()).hexdigest() for _, s in records], dtype="S64")
    lengths = np.array([len(s) for _, s in records], dtype=np.int64)
    with h5py.File(path, "w") as h5:
        ids = h5.create_dataset("ids", (n_rows,), dtype=h5py.string_dtype())
        sha256 = h5.create_dataset("sequence_sha256", (n_rows,), dtype="S64")
        length = h5.create_dataset("lengths", (n_rows,), dtype=np.int64)
        h5.create_dataset("mean/1", (n_rows, 32), dtype=np.float32, fillvalue=0)
        hashes = np.empty(n_rows, dtype=np.uint64)
        for start in range(0, n_rows, BLOCK):
            rows = np.arange(start, min(start + BLOCK, n_rows))
            source = rows % len(records)
            block = [f"t{r // len(records)}_{ids_of[s]}" for r, s in zip(rows, source)]
            ids[start : rows[-1] + 1] = np.array(block, dtype=object)
            sha256[start : rows[-1] + 1] = sha[source]
            length[start : rows[-1] + 1] = lengths[source]
            hashes[rows] = id_hashes(block)
        if with_index:
            write_id_index(h5, hashes)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[2_000_000, 10_000_000])
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    records = proteome()
    results = []
    with tempfile.TemporaryDirectory(prefix="esmshard-lookup-") as tmp:
        for n_rows in args.rows:
            for with_index in (True, False):
                path = Path(tmp) / f"embeddings-{n_rows}-{with_index}.h5"
                write_file(path, n_rows, records, with_index)
                row = {"rows": n_rows, **first_lookup(path), "file_mb": path.stat().st_size / 1e6}
                print(json.dumps(row), flush=True)
                results.append(row)
                path.unlink()
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
