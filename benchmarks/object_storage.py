"""The same run on this machine's filesystem and in S3 (moto's server on the loopback, each job in
an empty folder of its own): wall time, and the bytes that crossed to and from the server.

Usage: python benchmarks/object_storage.py [--records 1000] [--repeats 2] [--out FILE]

Real E. coli proteins (../shared/data) are tiled under new IDs up to `--records`; each side
starts from an empty store, so both compute every sequence. The sides alternate (local, S3,
local, S3, ...), and the S3 side's embeddings.h5 is checked against the local one's.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import h5py
import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from helpers import (  # noqa: E402
    PROTEOME,
    S3_ENV,
    Proxy,
    in_s3_isolated,
    moto_server,
    read_records,
    s3_client,
)

SETTINGS = ["model=random:esm2_t6_8M_UR50D", "repr_layers=[-1]", "include=[mean]"]


def tiled_fasta(n: int) -> bytes:
    records = read_records(PROTEOME)
    lines = [f">tile{k} {records[k % len(records)][0][1:]}\n{records[k % len(records)][1]}\n"
             for k in range(n)]  # fmt: skip
    return "".join(lines).encode()


def snakemake(workdir: Path, *args, env=None) -> float:
    """Seconds that one run of the workflow in `workdir` took."""
    workdir.mkdir(parents=True)
    cmd = ["snakemake", "-s", str(REPO / "Snakefile"), "-d", str(workdir), *args]
    full_env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    started = time.perf_counter()
    done = subprocess.run(cmd, env={**full_env, **(env or {})}, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(done.stderr[-3000:])
    return time.perf_counter() - started


def local_run(folder: Path, fasta: bytes) -> tuple[float, Path]:
    folder.mkdir(parents=True)
    (folder / "proteins.fasta").write_bytes(fasta)
    config = ["--config", f"input={folder / 'proteins.fasta'}", "outdir=out", *SETTINGS]
    seconds = snakemake(folder / "run", "--cores", "2", *config)
    return seconds, folder / "run" / "out" / "embeddings.h5"


def s3_run(folder: Path, proxy: Proxy, prefix: str, fasta: bytes) -> tuple[float, dict, bytes]:
    s3_client(proxy.port).put_object(Bucket="lab", Key=f"{prefix}/proteins.fasta", Body=fasta)
    before = dict(proxy.sent)
    seconds = snakemake(
        folder / "run",
        *in_s3_isolated(proxy.port, prefix),
        "--config", "input=proteins.fasta", "outdir=out", *SETTINGS,
        env=S3_ENV,
    )  # fmt: skip
    moved = {way: proxy.sent[way] - before[way] for way in proxy.sent}
    body = s3_client(proxy.port).get_object(Bucket="lab", Key=f"{prefix}/out/embeddings.h5")
    return seconds, moved, body["Body"].read()


def same_values(local_h5: Path, s3_h5: bytes, folder: Path) -> float:
    """The largest difference between the two runs' mean embeddings."""
    copy = folder / "s3.h5"
    copy.write_bytes(s3_h5)
    with h5py.File(local_h5) as a, h5py.File(copy) as b:
        (layer,) = a["mean"]
        return float(np.abs(a["mean"][layer][:] - b["mean"][layer][:]).max())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    fasta = tiled_fasta(args.records)
    rows = []
    with moto_server() as port, tempfile.TemporaryDirectory() as tmp:
        proxy = Proxy(port)
        s3_client(port).create_bucket(Bucket="lab")
        for repeat in range(args.repeats):
            folder = Path(tmp) / str(repeat)
            local_seconds, local_h5 = local_run(folder / "local", fasta)
            s3_seconds, moved, s3_h5 = s3_run(folder / "s3", proxy, f"bench{repeat}", fasta)
            rows.append({
                "records": args.records, "input_bytes": len(fasta),
                "local_seconds": round(local_seconds, 1), "s3_seconds": round(s3_seconds, 1),
                "bytes_to_server": moved["to the server"],
                "bytes_from_server": moved["from the server"],
                "embeddings_h5_bytes": len(s3_h5),
                "max_abs_difference": same_values(local_h5, s3_h5, folder),
            })  # fmt: skip
            print(json.dumps(rows[-1]), flush=True)
        proxy.stop()
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
