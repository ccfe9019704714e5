"""esmshard's approximate index (neighbours_index: ivf or hnsw) against its exact CPU search, on
the same vectors and cores: per reference size, the exact search's seconds; the index's first
search (its content read and hashed, the sampled queries searched exactly, the index built and
tuned, every query searched) and a second search that reads the kept index; its queries per
second; and recall@k of every query against the exact search, beside the recall the search
measured on its sample.

Usage: python benchmarks/approximate_index.py [--sizes 100000 300000 1000000] [--queries 10000]
                                             [--k 10] [--kind ivf] [--out FILE]

Needs faiss-cpu. The vectors are benchmarks/neighbours.py's: real E. coli proteins' means by
esm2_t33_650M_UR50D's shape (random weights), tiled with noise, 1,280 wide; the queries are
other tilings of the same means. Everything is in memory (a reference of 1M rows: 5.1 GB, and
as much again in an IVF index of flat vectors).
"""

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from exact_vs_faiss import InMemory  # noqa: E402
from neighbours import MODEL, means_apart, tiled  # noqa: E402

from esmshard.outputs.nearest import searched_by  # noqa: E402
from esmshard.search.approximate import IndexAsked, recall, searched  # noqa: E402


def timed(call):
    started = time.perf_counter()
    value = call()
    return value, time.perf_counter() - started


def one_size(queries, reference, k: int, kind: str, folder: Path) -> dict:
    """The exact search and two searches by a new index of `kind`, on the same vectors."""
    import faiss

    held = InMemory(reference)
    exact, exact_s = timed(
        lambda: searched_by(None, queries, held, 1, k, "euclidean", device="cpu").hits
    )
    asked = IndexAsked(kind, (folder,), f"{len(reference)}")
    first, first_s = timed(
        lambda: searched_by(asked, queries, held, 1, k, "euclidean", device="cpu")
    )
    again, again_s = timed(
        lambda: searched_by(asked, queries, held, 1, k, "euclidean", device="cpu")
    )
    index = faiss.read_index(again.index.path)
    _, query_s = timed(lambda: searched(index, queries, k, "euclidean", None, kind,
                                        again.index.setting))  # fmt: skip
    return {
        "reference": len(reference), "queries": len(queries), "k": k, "kind": kind,
        "exact_s": round(exact_s, 1), "first_search_s": round(first_s, 1),
        "build_s": first.index.build_seconds, "second_search_s": round(again_s, 1),
        "queries_per_s": round(len(queries) / query_s), "setting": again.index.setting,
        "sample_recall": again.index.recall, "recall": round(recall(again.hits, exact), 4),
        "exact_over_second": round(exact_s / again_s, 1),
        "exact_over_queries_alone": round(exact_s / query_s, 1),
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100_000, 300_000, 1_000_000])
    parser.add_argument("--queries", type=int, default=10_000)
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--kind", choices=["ivf", "hnsw"], default="ivf")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    rows = []
    means = means_apart(64, MODEL)
    with tempfile.TemporaryDirectory() as tmp:
        queries = tiled(means, args.queries, seed=2)
        for size in args.sizes:
            reference = tiled(means, size, seed=1)
            rows.append(one_size(queries, reference, args.k, args.kind, Path(tmp)))
            print(json.dumps(rows[-1]), flush=True)
            del reference
    if args.out:
        args.out.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
