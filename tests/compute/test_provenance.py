"""What computed each number is on record: parts, embeddings.h5, run.json, the last line, the report."""

import json

import h5py
import torch
from helpers import NEW, A, config, fasta, run_json, snakemake

from esmshard import __version__
from esmshard.compute.precision import CPU_AUTO_ENV
from esmshard.compute.provenance import COMPUTED_WITH
from esmshard.store import Store


def run(workdir, input_path, outdir, *more, env=None):
    return snakemake(
        workdir, {}, "--resources", "gpu=1", *config(input_path, outdir, *more), env=env
    )


def test_parts_computed_in_bf16_and_fp32_under_precision_auto_are_named(tmp_path):
    shared = tmp_path / "store"
    first = fasta(tmp_path / "first.fasta", A[:20])
    both = fasta(tmp_path / "both.fasta", A[:20] + NEW[:6])
    # `auto` resolves per device: bf16 where the first run computed, fp32 on this CPU after.
    alone = run(
        tmp_path,
        first,
        tmp_path / "first",
        f"store={shared}",
        "precision=auto",
        env={CPU_AUTO_ENV: "bf16"},
    )
    assert "mixed precisions" not in alone.stderr
    assert run_json(tmp_path / "first")["precisions"] == ["bf16"]
    mixed = run(tmp_path, both, tmp_path / "mixed", f"store={shared}", "precision=auto")

    store = Store(str(shared))
    (key,) = store.settings_keys()
    precisions = []
    for part in store.parts(key):
        with h5py.File(store.part(key, part)) as h5:
            attrs = dict(h5.attrs)
        precisions.append(attrs["precision"])
        assert attrs["device_name"] == "cpu" and attrs["torch_version"] == torch.__version__
        assert attrs["esmshard_version"] == __version__ and attrs["cuda_version"]
        assert attrs["fair_esm_version"] not in ("", "unknown")
    assert sorted(precisions) == ["bf16", "fp32"]

    with h5py.File(tmp_path / "mixed" / "embeddings.h5") as h5:
        attrs = dict(h5.attrs)
    assert attrs["precision"] == "bf16,fp32" and attrs["esmshard_version"] == __version__
    assert json.loads(attrs["devices"]) == ["cpu"]
    rows = json.loads(attrs["computed_with"])
    assert [(r["precision"], r["parts"]) for r in rows] == [("bf16", 1), ("fp32", 1)]
    assert all(set(r) == {*COMPUTED_WITH, "parts"} for r in rows)
    counts = run_json(tmp_path / "mixed")
    assert counts["precisions"] == ["bf16", "fp32"] and counts["devices"] == ["cpu"]
    assert counts["computed_with"] == rows and counts["esmshard_version"] == __version__

    assert "esmshard: mixed precisions: bf16 (1 part), fp32 (1 part)" in mixed.stderr
    report = (tmp_path / "mixed" / "report" / "scaling_report.html").read_text()
    assert "Mixed precisions: bf16 (1 part), fp32 (1 part)" in report
    assert "<h2>Computed with</h2>" in report
