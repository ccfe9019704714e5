"""`esmshard export` at scale: peak memory and time of each format, by number of proteins.

    python benchmarks/export.py --records 100000 1000000 --json export.json

Each size is a run of the real proteome tiled to N records under new IDs (benchmarks/scale.py's
input), embedded through the `snakemake` command with scale.py's micro ESM-2 (1 layer, D = 32,
random weights; the store computes each distinct sequence once) and `include: mean`. Each format
is then exported by its own `esmshard export` command under `/usr/bin/time -v` (wall time, peak
resident memory). Memory that stays flat from the smaller size to the larger is the claim. The
Parquet dataset is read back whole by pyarrow's dataset API and by DuckDB (and Polars, where it
is installed): their row counts, and whether their tables equal each other and the IDs and
values of embeddings.h5.
"""

import argparse
import json
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from scale import PROTEOME, REPO, cpu_model, du, micro_checkpoint, tile, timed  # noqa: E402

# Each measured export: its command-line options. Tiled input repeats 4,322 sequences, so the
# hash-keyed per-protein file holds that many datasets; keyed by ID it holds one per record.
EXPORTS = {
    "npy": ["--format", "npy"],
    "parquet": ["--format", "parquet"],
    "per-protein-h5": ["--format", "per-protein-h5"],
    "per-protein-h5-by-id": ["--format", "per-protein-h5", "--key", "id"],
    "pt": ["--format", "pt"],
}


def run(n_records: int, workdir: Path, checkpoint: Path, formats) -> dict:
    folder = workdir / f"n{n_records}"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    tile(PROTEOME, n_records, folder / "tiled.fasta")
    made = subprocess.run(
        ["snakemake", "-s", str(REPO / "Snakefile"), "--cores", "2", "--resources", "gpu=1",
         "--quiet", "--config", "input=tiled.fasta", "outdir=results", f"model={checkpoint}",
         "shards=1"], cwd=folder, capture_output=True, text=True,
    )  # fmt: skip
    if made.returncode:
        sys.exit(made.stderr[-3000:])
    result = {
        "records": n_records,
        "embeddings_h5_bytes": du(folder / "results" / "embeddings.h5"),
    }
    for fmt in formats:
        result[fmt] = measure_export(folder, "results", fmt)
        print(n_records, fmt, json.dumps(result[fmt]), flush=True)
    shutil.rmtree(folder)
    return result


def measure_export(folder: Path, outdir: str, fmt: str) -> dict:
    """`esmshard export outdir` as `fmt`, run in `folder`: its time, peak memory and output
    bytes (and the Parquet dataset's read-back); the output is removed after."""
    out = folder / f"export.{fmt}"
    measured = timed(["esmshard", "export", outdir, *EXPORTS[fmt], "--out", out.name], folder)
    measured["output_bytes"] = du(out)
    if fmt == "parquet":
        measured["read_back"] = parquet_read_back(out, folder / outdir / "embeddings.h5")
    shutil.rmtree(out) if out.is_dir() else out.unlink()
    return measured


def parquet_read_back(folder: Path, embeddings: Path) -> dict:
    """The dataset as pyarrow, DuckDB and Polars read it in place, against embeddings.h5."""
    import duckdb
    import numpy as np
    import pyarrow.dataset as ds

    import esmshard

    files = str(folder / "*.parquet")
    tables = {
        "pyarrow": ds.dataset(folder, format="parquet").to_table(),
        "duckdb": duckdb.sql(f"SELECT * FROM read_parquet('{files}')").fetch_arrow_table(),
    }
    try:
        import polars as pl

        tables["polars"] = pl.scan_parquet(files).collect().to_arrow()
    except ImportError:
        pass
    reference = tables["pyarrow"]
    with esmshard.open_embeddings(embeddings) as emb:  # a copy or in place
        (layer,) = emb.layers["mean"]
        column = reference.column(f"mean_{layer}").combine_chunks()
        values = column.flatten().to_numpy().reshape(len(column), -1)
        same_as_h5 = reference.column("id").to_pylist() == emb.ids()
        same_as_h5 = same_as_h5 and np.array_equal(values, emb.array("mean", layer))
    return {
        "files": len(list(folder.glob("*.parquet"))),
        "rows": {name: table.num_rows for name, table in tables.items()},
        "tables_equal": all(
            table.cast(reference.schema).equals(reference) for table in tables.values()
        ),
        "equal_to_embeddings_h5": same_as_h5,
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, nargs="*", default=[100_000, 1_000_000])
    parser.add_argument("--formats", nargs="*", default=list(EXPORTS), choices=list(EXPORTS))
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="esmshard-export-"))
    checkpoint = micro_checkpoint(workdir / "model")
    results = {
        "machine": {"cpu": cpu_model(), "python": platform.python_version()},
        "runs": [run(n, workdir, checkpoint, args.formats) for n in args.records],
    }
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
