"""esmshard's exact CPU search against faiss' exact flat index, side by side on the same vectors:
2,000 queries against 100,000 reference proteins of ESM-2 650M's width (1,280), k = 10,
euclidean, both in memory and on the same cores.

Usage: python benchmarks/exact_vs_faiss.py [--queries 2000] [--reference 100000] [--k 10]
                                          [--repeats 3] [--out FILE]

Needs faiss-cpu (pip install faiss-cpu). The vectors are benchmarks/neighbours.py's: real
E. coli proteins' means by esm2_t33_650M_UR50D's shape (random weights), tiled with noise. The
two sides alternate, `--repeats` times each; faiss' index is built (its `add`) inside its timing,
as esmshard reads its reference inside its own. Printed per round: each side's seconds, their
ratio, and how many of the queries get the same k rows from both; then, for a sample of 200
queries, how many get from each side the k rows of a search of every distance in float64.
"""

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from neighbours import MODEL, means_apart, nearest_by_chunks, tiled  # noqa: E402

from esmshard.outputs.nearest import search  # noqa: E402


class InMemory:
    """A reference as `search` reads it, held in memory."""

    def __init__(self, values: np.ndarray):
        self.values = values

    def stored(self, name: str) -> np.ndarray:
        return self.values


def with_faiss(queries: np.ndarray, reference: np.ndarray, k: int) -> np.ndarray:
    import faiss

    index = faiss.IndexFlatL2(reference.shape[1])
    index.add(reference)
    return index.search(queries, k)[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queries", type=int, default=2_000)
    parser.add_argument("--reference", type=int, default=100_000)
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    means = means_apart(64, MODEL)
    queries = tiled(means, args.queries, seed=2)
    reference = tiled(means, args.reference, seed=1)
    rounds = []
    for _ in range(args.repeats):
        started = time.perf_counter()
        ours = search(queries, InMemory(reference), 1, args.k, "euclidean", device="cpu").rows
        esmshard_s = time.perf_counter() - started
        started = time.perf_counter()
        theirs = with_faiss(queries, reference, args.k)
        faiss_s = time.perf_counter() - started
        rounds.append({"esmshard_s": round(esmshard_s, 2), "faiss_flat_s": round(faiss_s, 2),
                       "esmshard_over_faiss": round(esmshard_s / faiss_s, 2),
                       "queries_same_rows": int((np.sort(ours, 1) == np.sort(theirs, 1))
                                                .all(axis=1).sum())})  # fmt: skip
        print(json.dumps(rounds[-1]), flush=True)
    sample = np.arange(0, args.queries, max(1, args.queries // 200))
    truth = np.sort(nearest_by_chunks(queries[sample], reference, args.k), 1)
    exact = {
        "sample": int(sample.size),
        "esmshard_equal_to_float64": int((np.sort(ours[sample], 1) == truth).all(1).sum()),
        "faiss_equal_to_float64": int((np.sort(theirs[sample], 1) == truth).all(1).sum()),
    }
    print(json.dumps(exact), flush=True)
    result = {"queries": args.queries, "reference": args.reference, "width": int(means.shape[1]),
              "k": args.k, "rounds": rounds, **exact}  # fmt: skip
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
