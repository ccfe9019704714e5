"""The clean-up of killed writers' leftovers at a run's start, on a store of many parts.

    python benchmarks/cleanup.py --parts 10000 --repeats 5

A store (inside the outdir, as by default) of one settings key holding `--parts` parts, each an
empty `.h5` and its manifest, plus a user's folder of 1,000 files beside the outputs: what the
clean-up (esmshard.store.leftovers.remove_leftovers) walks. It prints the median seconds of a
clean-up that finds nothing to remove, against the median seconds of `snakemake --version`
(the least a run's start costs), as JSON.
"""

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from esmshard.store import Store, add_settings
from esmshard.store.leftovers import remove_leftovers


def make_store(outdir: Path, n_parts: int) -> Store:
    store = Store(str(outdir / "store"))
    key = "0123456789abcdef"
    add_settings(store, key, {"model": "benchmark"})
    folder = Path(store.folder(key))
    for i in range(n_parts):
        (folder / f"p-{i:06d}.h5").touch()
        (folder / f"p-{i:06d}.json").write_text("{}")
    users = outdir / "notes"
    users.mkdir()
    for i in range(1000):
        (users / f".draft.{i}.tmp").write_text("a user's")
    return store


def median_seconds(action, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        action()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", type=int, default=10000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    snakemake = Path(sys.executable).parent / "snakemake"
    with tempfile.TemporaryDirectory() as scratch:
        outdir = Path(scratch) / "results"
        outdir.mkdir()
        store = make_store(outdir, args.parts)
        cleanup = median_seconds(lambda: remove_leftovers(outdir, store), args.repeats)
        assert remove_leftovers(outdir, store) == []
    start = median_seconds(
        lambda: subprocess.run([snakemake, "--version"], check=True, capture_output=True),
        args.repeats,
    )
    print(json.dumps({"parts": args.parts, "cleanup_seconds": round(cleanup, 4),
                      "snakemake_version_seconds": round(start, 3),
                      "cleanup_share_of_start": round(cleanup / start, 4)}))  # fmt: skip


if __name__ == "__main__":
    main()
