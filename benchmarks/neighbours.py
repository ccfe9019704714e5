"""Exact nearest neighbours at scale: 10,000 queries against 1,000,000 reference proteins of
ESM-2 650M's width (1,280), the reference streamed from disk block by block, as a search job
reads its part of an embeddings.h5.

Usage: python benchmarks/neighbours.py [--queries 10000] [--reference 1000000] [--k 10]
                                       [--device cpu] [--out FILE]

The vectors are real proteins' means: E. coli proteins (../shared/data) embedded with
esm2_t33_650M_UR50D's shape (random weights, their first 64 residues, on this machine), tiled
under new rows with a little noise each so that no two rows are equal. The reference is written
to an HDF5 file in the layout of embeddings.h5's `mean/<layer>`; the search reads it through
esmshard.outputs.nearest.search, as the `neighbour_part` job does. Printed: wall time, reference
rows and query-row pairs per second, and the process's peak resident memory against the
reference's size (flat: it does not grow with the reference).
"""

import argparse
import json
import multiprocessing
import resource
import sys
import tempfile
import time
from pathlib import Path

import h5py
import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from helpers import PROTEOME, read_records  # noqa: E402

import esmshard  # noqa: E402
from esmshard.outputs.nearest import search  # noqa: E402

MODEL = "random:esm2_t33_650M_UR50D"
ROWS_WRITTEN_AT_ONCE = 1 << 16


class OnDisk:
    """A reference as `search` reads it: the mean embeddings of an HDF5 file, by name."""

    def __init__(self, h5: h5py.File):
        self.h5 = h5

    def stored(self, name: str):
        return self.h5[name]


def real_means(n: int, model: str, out: Path) -> None:
    """Save the mean embeddings of `n` E. coli proteins' first 64 residues, by `model` (in a
    process of its own: the model's memory is not the search's)."""
    records = {h[1:].split()[0]: s for h, s in read_records(PROTEOME)[:n]}
    with tempfile.TemporaryDirectory() as store:
        emb = esmshard.embed(records, model, truncation_seq_length=64, store=store)
        np.save(out, np.asarray(emb.array("mean"), dtype=np.float32))


def means_apart(n: int, model: str) -> np.ndarray:
    """`real_means` of `n` proteins, computed in a process of its own (spawned: no torch state
    shared with the search)."""
    with tempfile.TemporaryDirectory() as tmp:
        child = multiprocessing.get_context("spawn").Process(
            target=real_means, args=(n, model, Path(tmp) / "means.npy")
        )
        child.start()
        child.join()
        return np.load(Path(tmp) / "means.npy")


def nearest_by_chunks(queries: np.ndarray, reference, k: int) -> np.ndarray:
    """The k nearest rows of a few queries, every distance in float64, the reference by chunks."""
    found = []
    for start in range(0, len(reference), ROWS_WRITTEN_AT_ONCE):
        chunk = reference[start : start + ROWS_WRITTEN_AT_ONCE].astype(np.float64)
        found.append((chunk**2).sum(1)[:, None] - 2 * chunk @ queries.T.astype(np.float64))
    d = np.concatenate(found).T + (queries.astype(np.float64) ** 2).sum(1)[:, None]
    return np.argsort(d, axis=1, kind="stable")[:, :k]


def tiled(means: np.ndarray, rows: int, seed: int, start: int = 0) -> np.ndarray:
    """Rows `start`... of the means tiled, each with noise of 5% of the means' spread."""
    rng = np.random.default_rng(seed + start)
    picked = means[np.arange(start, start + rows) % len(means)]
    return picked + 0.05 * means.std(axis=0) * rng.standard_normal(picked.shape, np.float32)


def write_reference(path: Path, means: np.ndarray, rows: int) -> None:
    with h5py.File(path, "w") as h5:
        data = h5.create_dataset("mean/1", (rows, means.shape[1]), np.float32)
        for start in range(0, rows, ROWS_WRITTEN_AT_ONCE):
            n = min(ROWS_WRITTEN_AT_ONCE, rows - start)
            data[start : start + n] = tiled(means, n, seed=1, start=start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queries", type=int, default=10_000)
    parser.add_argument("--reference", type=int, default=1_000_000)
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--device", default="cpu", help="where the products run (cpu, cuda)")
    parser.add_argument("--model", default=MODEL, help="whose means are tiled (its width)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    means = means_apart(64, args.model)
    with tempfile.TemporaryDirectory() as tmp:
        queries = tiled(means, args.queries, seed=2)
        path = Path(tmp) / "reference.h5"
        write_reference(path, means, args.reference)
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10
        started = time.perf_counter()
        with h5py.File(path, "r") as h5:
            hits = search(queries, OnDisk(h5), 1, args.k, "euclidean", device=args.device)
        seconds = time.perf_counter() - started
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10
        # a sample of queries against every distance, as a check
        sample = np.arange(0, args.queries, max(1, args.queries // 20))
        with h5py.File(path, "r") as h5:
            expected = nearest_by_chunks(queries[sample], h5["mean/1"], args.k)
    result = {
        "queries": args.queries, "reference": args.reference, "width": int(means.shape[1]),
        "k": args.k, "device": args.device, "seconds": round(seconds, 1),
        "reference_rows_per_second": round(args.reference / seconds),
        "pairs_per_second": round(args.queries * args.reference / seconds),
        "reference_gb": round(args.reference * means.shape[1] * 4 / 1e9, 2),
        "peak_rss_gb_before_search": round(before / 2**10, 2),
        "peak_rss_gb_search": round(peak / 2**10, 2),
        "sample_equal_to_whole_matrix": bool((hits.rows[sample] == expected).all()),
    }  # fmt: skip
    print(json.dumps(result), flush=True)
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
