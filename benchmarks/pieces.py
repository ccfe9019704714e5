"""What keeping pieces costs an embed job (esmshard.store.pieces): the time spent putting pieces
in place (closing, hashing) and making the part of them, against the job's whole time.

    python benchmarks/pieces.py --records 400 --keep-every 0 1 60 --repeats 3

One shard of every `--every`-th protein of the E. coli proteome (its first `--records`), embedded
by the embed step itself (esmshard.steps.embed.run_shard) with `--model`, `include: [mean,
per_tok]` and the last layer, once per `--keep-every` value and repetition, alternating. Prints
one JSON line per value: the medians of the job's seconds, its `keep_seconds` and
`assemble_seconds` (its metrics), their share of the job, and the part's megabytes per second of
assembly. Before pieces, a job wrote its batches into its part directly:
keeping and assembling are what pieces add.
"""

import argparse
import json
import os
import statistics
import tempfile
from pathlib import Path

from esmshard.input.datasets import shared_data_dir, write_every_nth_record
from esmshard.input.sizing import ModelSize
from esmshard.steps.embed import run_shard
from esmshard.steps.shard import write_shards
from esmshard.store import Store, settings_key


def one_job(fasta: Path, folder: Path, model: str, keep_every: int, threads: int) -> dict:
    settings = dict(
        model=model, repr_layers=[-1], include=["mean", "per_tok"], truncation_seq_length=1022,
        long_sequences="truncate", precision="fp32", fast_path=True, checkpoint="random",
    )  # fmt: skip
    store = Store(str(folder / "store"))
    key = settings_key(settings)
    plan = write_shards([fasta], folder / "shards", 1, 1022, ModelSize(1, 1), store.root,
                        settings, folder / "checksums.json")  # fmt: skip
    shard = plan["shards"][0]["shard"]
    os.environ["ESMSHARD_POOL_DIR"] = str(folder / "pool")
    metrics = run_shard(
        folder / "shards" / f"{shard}.tsv", store.part(key, shard), store.manifest(key, shard),
        folder / "metrics.json", shard=shard, settings=settings, toks_per_batch=4096, gpus=[],
        keep_every=keep_every, threads=threads, progress_json=folder / "progress.json",
        telemetry_tsv=folder / "telemetry.tsv", outdir=str(folder),
    )  # fmt: skip
    metrics["part_bytes"] = os.path.getsize(store.part(key, shard))
    return metrics


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=400)
    parser.add_argument("--every", type=int, default=4)
    parser.add_argument("--model", default="random:esm2_t6_8M_UR50D")
    parser.add_argument("--keep-every", type=int, nargs="+", default=[0, 1, 60])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        every = tmp / "every.fasta"
        write_every_nth_record(shared_data_dir() / "ecoli_k12_UP000000625.fasta", every,
                               args.every)  # fmt: skip
        fasta = tmp / "proteins.fasta"
        text = every.read_text().split(">")[1 : args.records + 1]
        fasta.write_text("".join(">" + record for record in text))
        runs = {value: [] for value in args.keep_every}
        for repeat in range(args.repeats):
            for value in args.keep_every:  # alternating, so that drifts hit every value alike
                runs[value].append(one_job(fasta, tmp / f"{value}-{repeat}", args.model, value,
                                           args.threads))  # fmt: skip
        for value, found in runs.items():
            seconds = statistics.median(m["seconds"] for m in found)
            keep = statistics.median(m["keep_seconds"] for m in found)
            assemble = statistics.median(m["assemble_seconds"] for m in found)
            print(json.dumps({
                "keep_every": value, "records": found[0]["n_sequences"],
                "residues": found[0]["n_residues"], "model": args.model,
                "job_seconds": seconds, "keep_seconds": keep, "assemble_seconds": assemble,
                "share_of_job": (keep + assemble) / seconds,
                "part_mb": found[0]["part_bytes"] / 1e6,
                "assemble_mb_per_s": found[0]["part_bytes"] / 1e6 / assemble,
                "runs": [m["seconds"] for m in found],
            }), flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
