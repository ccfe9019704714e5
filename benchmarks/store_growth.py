"""What a small run costs the bucket as a shared store in object storage grows: 20 new proteins
against a store of 1k, 10k and 100k proteins (moto's S3 server on the loopback, each job in an
empty folder of its own, as on a cloud batch service).

Usage: python benchmarks/store_growth.py [--sizes 1000 10000 100000] [--new 20] [--out FILE]

The store is filled with real E. coli proteins (../shared/data) tiled under new IDs, each made a
sequence of its own by a tail of four residues, embedded in parts of 1,000 (the micro ESM-2 of
the tests, `include: [mean]`), put in the bucket and indexed (`esmshard store --verify`, as for
parts copied in by hand); the run's 20 proteins are new to it. For each size: the run's wall
time, the requests and bytes that crossed to the server (HTTP included), and each step's own
count from its log (`store copy: N of M files fetched, B bytes`; the shard step's key index
nodes read).
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from helpers import (  # noqa: E402
    MODEL,
    PROTEOME,
    S3_ENV,
    Proxy,
    in_s3_isolated,
    moto_server,
    read_records,
    s3_client,
    snakemake_command,
)

import esmshard  # noqa: E402

AMINO = "ACDEFGHIKLMNPQRSTVWY"
PART = 1000  # proteins a part of the filled store holds
SETTINGS = [f"model={MODEL}", "repr_layers=[-1]", "include=[mean]"]


def tiled(start: int, stop: int) -> dict[str, str]:
    """Proteins `start` .. `stop`: E. coli's, each with a tail that makes its sequence new."""
    records = read_records(PROTEOME)
    found = {}
    for k in range(start, stop):
        tail = "".join(AMINO[(k // 20**i) % 20] for i in range(6))
        found[f"tile{k}"] = records[k % len(records)][1] + tail
    return found


def fill(folder: Path, port: int, start: int, stop: int) -> float:
    """Embed proteins `start` .. `stop` into the store at `folder`, a part a thousand, and put
    its new files in s3://lab/shared; the seconds it took."""
    began = time.perf_counter()
    for low in range(start, stop, PART):
        esmshard.embed(tiled(low, min(low + PART, stop)), MODEL, repr_layers=[-1],
                       include=["mean"], store=folder)  # fmt: skip
    client = s3_client(port)
    listed = client.list_objects_v2(Bucket="lab", Prefix="shared/")  # < 1,000 keys: one page
    there = {item["Key"] for item in listed.get("Contents", [])}
    for path in folder.rglob("*"):
        key = f"shared/{path.relative_to(folder).as_posix()}"
        if path.is_file() and key not in there and "/.locks/" not in f"/{key}":
            client.upload_file(str(path), "lab", key)
    env = {**os.environ, **S3_ENV, "AWS_ENDPOINT_URL_S3": f"http://127.0.0.1:{port}"}
    verify = ["esmshard", "store", "s3://lab/shared", "--verify"]
    subprocess.run(verify, env=env, check=True, capture_output=True)
    return time.perf_counter() - began


def run_new(folder: Path, proxy: Proxy, prefix: str, proteins: dict) -> dict:
    """One run of `proteins` against the shared store: what it cost the bucket."""
    text = "".join(f">{name}\n{sequence}\n" for name, sequence in proteins.items())
    s3_client(proxy.port).put_object(Bucket="lab", Key=f"{prefix}/proteins.fasta", Body=text)
    _, env = snakemake_command(folder, {}, env=S3_ENV)
    cmd = ["snakemake", "-s", str(REPO / "Snakefile"), "-d", str(folder),
           *in_s3_isolated(proxy.port, prefix),
           "--config", "input=proteins.fasta", "outdir=out", *SETTINGS, "store=s3://lab/shared"]  # fmt: skip
    before, requests = dict(proxy.sent), proxy.requests
    began = time.perf_counter()
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - began
    if done.returncode:
        raise SystemExit(done.stderr[-3000:])
    row = {"run_seconds": round(seconds, 1), "requests": proxy.requests - requests,
           "bytes_from_server": proxy.sent["from the server"] - before["from the server"],
           "bytes_to_server": proxy.sent["to the server"] - before["to the server"]}  # fmt: skip
    for step in ("shard", "merge"):
        log = s3_client(proxy.port).get_object(Bucket="lab", Key=f"{prefix}/out/logs/{step}.log")
        text = log["Body"].read().decode()
        files, listed, fetched = re.search(
            r"store copy: (\d+) of (\d+) files fetched, (\d+) bytes", text
        ).groups()
        row[f"{step}_files_fetched"] = f"{files} of {listed}"
        row[f"{step}_bytes_fetched"] = int(fetched)
        nodes = re.search(r"key index: (\d+) nodes read", text)
        if nodes:
            row[f"{step}_index_nodes_read"] = int(nodes[1])
        peak = re.findall(r"peak memory so far (\d+) MB", text)
        if peak:
            row[f"{step}_peak_mb"] = max(map(int, peak))
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000, 100000])
    parser.add_argument("--new", type=int, default=20)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    rows = []
    with moto_server() as port, tempfile.TemporaryDirectory() as tmp:
        proxy = Proxy(port)
        s3_client(port).create_bucket(Bucket="lab")
        filled = 0
        for size in args.sizes:
            fill_seconds = fill(Path(tmp) / "store", port, filled, size)
            filled = size
            new = tiled(10**7 + size, 10**7 + size + args.new)
            row = {"store_proteins": size, "store_parts": -(-size // PART),
                   "fill_seconds": round(fill_seconds, 1),
                   **run_new(Path(tmp) / f"run{size}", proxy, f"run{size}", new)}  # fmt: skip
            rows.append(row)
            print(json.dumps(row), flush=True)
        proxy.stop()
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
