"""Outputs read in place (esmshard.embeddings_h5.in_place), through the `snakemake` command line as users type
it: the numbers of a copy from a fraction of its bytes, kept by `esmshard store --prune`,
copied whole by `esmshard export --format h5`."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import h5py
import pytest
from helpers import MODEL, PROTEINS, assert_same_values, every_value, run_json, snakemake

from esmshard.files import DamagedFileError
from esmshard.outputs.reader import Embeddings

ESMSHARD = str(Path(sys.executable).parent / "esmshard")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """One run copied, then the same settings in place in another outdir, on the first's store."""
    workdir = tmp_path_factory.mktemp("in-place")
    (workdir / "proteins.fasta").write_text(PROTEINS.read_text())
    typed = ["--config", "input=proteins.fasta", f"model={MODEL}", "repr_layers=[-1,3]",
             "include=[mean,per_tok,contacts,logits]"]  # fmt: skip
    snakemake(workdir, {}, *typed, "outdir=copied")
    snakemake(workdir, {}, *typed, "outdir=placed", "store=copied/store", "output_values=in_place")
    return workdir


def bytes_under(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def parts_of(embeddings: Path) -> list[Path]:
    with h5py.File(embeddings) as h5:
        return [embeddings.parent / p for p in h5["in_place/parts"].asstr()[:]]


def test_in_place_gives_the_copys_numbers_from_a_tenth_of_its_bytes(workdir):
    copied, placed = workdir / "copied", workdir / "placed"
    assert run_json(copied)["output_values"] == "copy"
    assert run_json(placed)["output_values"] == "in_place"
    assert run_json(placed)["computed_by_this_command"] == 0  # the store had every sequence
    assert_same_values(
        every_value(copied / "embeddings.h5"), every_value(placed / "embeddings.h5")
    )
    with Embeddings(copied) as a, Embeddings(placed) as b:
        for row in (0, len(a) - 1):
            assert (a.contact_map(row) == b.contact_map(row)).all()
    parts = parts_of(placed / "embeddings.h5")
    # the store is the other outdir's: an absolute path
    assert parts and all(p.is_absolute() and p.is_file() for p in parts)
    assert bytes_under(placed) <= 0.1 * sum(p.stat().st_size for p in parts)


def test_export_h5_is_the_copy_and_needs_no_store(workdir):
    result = subprocess.run([ESMSHARD, "export", "placed", "--format", "h5", "--out", "copy.h5"],
                            cwd=workdir, capture_output=True, text=True)  # fmt: skip
    assert result.returncode == 0, result.stderr
    with h5py.File(workdir / "copy.h5") as h5:
        assert h5.attrs["output_values"] == "copy" and "in_place" not in h5
    assert_same_values(every_value(workdir / "copied" / "embeddings.h5"),
                       every_value(workdir / "copy.h5"))  # fmt: skip
    with Embeddings(workdir / "copied") as a, Embeddings(workdir / "copy.h5") as b:
        assert all((a.contact_map(row) == b.contact_map(row)).all() for row in range(len(a)))


def test_prune_keeps_what_the_output_reads_its_plan_removed_or_not(workdir):
    placed = workdir / "placed"
    parts = parts_of(placed / "embeddings.h5")
    prune = [ESMSHARD, "store", "copied/store", "--prune", "--keep", "placed", "--apply"]
    for plan_removed in (False, True):
        if plan_removed:
            shutil.rmtree(placed / "shards")
        result = subprocess.run(prune, cwd=workdir, capture_output=True, text=True)
        assert result.returncode == 0, result.stderr
        assert all(p.is_file() for p in parts)
        with Embeddings(placed) as emb:
            assert len(emb) == 40


def test_a_part_changed_or_gone_is_refused_by_every_read_and_the_same_command_repairs_it(
    workdir,
):
    # without contact maps: the middle of the part is per-residue values
    typed = ["--config", "input=proteins.fasta", f"model={MODEL}", "repr_layers=[-1,3]",
             "include=[mean,per_tok]", "outdir=repaired", "output_values=in_place"]  # fmt: skip
    snakemake(workdir, {}, *typed)
    placed = workdir / "repaired" / "embeddings.h5"
    whole = every_value(placed)
    (part,) = parts_of(placed)
    with open(part, "r+b") as fh:  # 16 bytes changed, the size kept
        fh.seek(part.stat().st_size // 2)
        fh.write(bytes(16))
    with pytest.raises(DamagedFileError, match=re.escape(str(part.name))) as refused:
        every_value(placed)
    assert "run the same command again" in str(refused.value)
    exported = subprocess.run([ESMSHARD, "export", "repaired", "--format", "npy", "--out", "npy"],
                              cwd=workdir, capture_output=True, text=True)  # fmt: skip
    assert exported.returncode != 0 and part.name in exported.stderr
    assert "run the same command again" in exported.stderr
    # What the message says, as written: the same command
    repaired = snakemake(workdir, {}, *typed)
    assert "read its values in place from store parts that are gone or changed" in (
        repaired.stdout + repaired.stderr
    )
    assert_same_values(whole, every_value(placed))
    # a part gone: the same again
    (part,) = parts_of(placed)
    part.unlink()
    with pytest.raises(DamagedFileError, match=re.escape(f"{part.name} is gone")):
        every_value(placed)
    # what status says of the finished run: finished, and what is broken
    said = subprocess.run([ESMSHARD, "status", "repaired"], cwd=workdir, capture_output=True,
                          text=True).stdout.splitlines()  # fmt: skip
    assert said[-2].startswith("shards 1/1 (100%)") and said[-2].endswith("finished"), said
    assert said[-1] == (
        f"embeddings.h5 reads its values in place from store parts gone or changed: {part} is "
        "gone; run the same command again: it computes the sequences of the parts gone or "
        "changed and writes embeddings.h5 anew"
    )
    snakemake(workdir, {}, *typed)
    assert_same_values(whole, every_value(placed))
