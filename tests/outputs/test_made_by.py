"""Every output of a run names what made it: the model as given and its weights' SHA-256."""

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import h5py
import pyarrow.dataset as ds
import torch
from helpers import MODEL, PROTEINS, config, fasta, read_records, snakemake

ESMSHARD = Path(sys.executable).parent / "esmshard"


def test_every_output_names_the_model_and_its_weights_sha256(tmp_path):
    snakemake(tmp_path, {}, *config(PROTEINS, "out", "include=[mean,per_tok]", "shards=1"))
    out = tmp_path / "out"
    sha256 = hashlib.sha256(Path(MODEL).read_bytes()).hexdigest()
    for fmt, target in (("parquet", "e.parquet"), ("npy", "npy"), ("pt", "pt"),
                        ("per-protein-h5", "p.h5")):  # fmt: skip
        done = subprocess.run([str(ESMSHARD), "export", "out", "--format", fmt, "--out", target],
                              cwd=tmp_path, capture_output=True, text=True)  # fmt: skip
        assert done.returncode == 0, done.stderr
    with h5py.File(out / "embeddings.h5") as h5:
        attrs = dict(h5.attrs)
    with h5py.File(tmp_path / "p.h5") as h5:
        per_protein = dict(h5.attrs)
    run = json.loads((out / "run.json").read_text())["made_by"]
    parquet = json.loads(ds.dataset(tmp_path / "e.parquet").schema.metadata[b"esmshard"])
    npy = json.loads((tmp_path / "npy" / "made_by.json").read_text())
    pt_file = next((tmp_path / "pt").glob("*.pt"))
    pt = torch.load(pt_file, weights_only=False)["esmshard"]
    report = (out / "report" / "scaling_report.html").read_text()
    for name, card in (("embeddings.h5", attrs), ("run.json", run), ("parquet", parquet),
                       ("npy", npy), ("pt", pt), ("per-protein-h5", per_protein)):  # fmt: skip
        assert card["model"] == MODEL and card["weights_sha256"] == sha256, name
        assert card["model_family"] == "esm2" and card["num_layers"] == 6, name
        assert card["embed_dim"] == 32 and card["precision"] == "fp32", name
        assert card["settings_key"] == run["settings_key"] and card["esmshard_version"], name
    assert MODEL in report and sha256 in report and run["settings_key"] in report


def test_random_weights_say_so_in_every_output(tmp_path):
    few = fasta(tmp_path / "few.fasta", read_records(PROTEINS)[:5])  # the labels, not the numbers
    snakemake(tmp_path, {}, *config(few, "out", "model=random:esm2_t6_8M_UR50D", "shards=1"))
    with h5py.File(tmp_path / "out" / "embeddings.h5") as h5:
        assert h5.attrs["weights_sha256"] == "random" and h5.attrs["weights"] == "random"
        assert h5.attrs["model"] == "random:esm2_t6_8M_UR50D"
