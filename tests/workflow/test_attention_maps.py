"""Attention maps through `snakemake`: the layers and heads asked for, as fair-esm gives them,
their size said before any embed job and refused where the disk cannot hold it."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import torch
from helpers import PROTEOME, fair_esm_model, fasta, jobs_run, read_records, small_disk, snakemake

import esmshard

RECORDS = [r for r in read_records(PROTEOME) if 40 <= len(r[1]) <= 90][:4]
IDS = [h[1:].split()[0] for h, _ in RECORDS]
MAPS = ["include=[mean,attentions]", "attention_layers=[1,-1]", "attention_heads=all"]


def test_attention_maps_equal_fair_esm_and_their_size_is_said_first(tmp_path, checkpoint):
    fasta(tmp_path / "proteins.fasta", RECORDS)
    config = {"input": "proteins.fasta", "model": str(checkpoint)}
    done = snakemake(tmp_path, config, "--config", *MAPS, "contacts_dtype=float32")
    pairs = sum(len(s) ** 2 for _, s in RECORDS)
    size = 4 * 2 * 20 * pairs  # two layers, 20 heads, float32
    said = [line for line in done.stderr.splitlines() if "attention maps:" in line]
    assert len(said) == 1 and f"attention maps: {size / 1e6:.1f} MB in the store" in said[0]
    net, alphabet = fair_esm_model(checkpoint)
    with esmshard.open_embeddings(tmp_path / "results" / "embeddings.h5") as emb:
        assert emb.attention_layers == [1, 6]
        for id_, (_, sequence) in zip(IDS, RECORDS):
            _, _, toks = alphabet.get_batch_converter()([(id_, sequence)])
            with torch.no_grad():
                want = net(toks, need_head_weights=True)["attentions"][0, [0, 5], :, 1:-1, 1:-1]
            np.testing.assert_allclose(emb[id_].attentions, want.numpy(), atol=1e-5, rtol=0)
    exported = tmp_path / "pt"
    subprocess.run([str(Path(sys.executable).parent / "esmshard"), "export", "results",
                    "--format", "pt", "--out", str(exported)], cwd=tmp_path, check=True)  # fmt: skip
    first = torch.load(exported / f"{IDS[0]}.pt".replace("|", "%7C"), weights_only=False)
    assert first["attentions"].shape == (2, 20, len(RECORDS[0][1]), len(RECORDS[0][1]))


def test_maps_the_disk_cannot_hold_are_refused_before_any_embed_job(tmp_path, checkpoint):
    fasta(tmp_path / "proteins.fasta", RECORDS)
    with small_disk(tmp_path / "disk", 1) as disk:
        config = {"input": "proteins.fasta", "model": str(checkpoint), "store": str(disk)}
        done = snakemake(tmp_path, config, "--config", *MAPS, check=False)
    assert done.returncode != 0 and "embed" not in jobs_run(done)
    refused = [line for line in done.stderr.splitlines() if "the attention maps need" in line]
    assert refused and f"at {disk} (the store's " in refused[0]
    assert "attention_heads: mean" in refused[0]


def test_the_disk_check_counts_the_pieces_kept_beside_a_part_while_it_is_made(
    tmp_path, checkpoint
):
    """A store disk of 1.5x the maps' size: the maps fit, but not a shard's kept pieces beside
    the part made of them (2x): refused before any embed job, naming both, nothing written."""
    fasta(tmp_path / "proteins.fasta", RECORDS)
    in_store = 4 * 2 * 20 * sum(len(s) ** 2 for _, s in RECORDS)  # two layers, 20 heads
    megabytes = -(-3 * in_store // 2 // 2**20)  # 1.5x, rounded up to whole MB
    assert megabytes * 2**20 < 2 * in_store
    with small_disk(tmp_path / "disk", megabytes) as disk:
        config = {"input": "proteins.fasta", "model": str(checkpoint), "store": str(disk)}
        done = snakemake(tmp_path, config, "--config", *MAPS, "shards=1", check=False)
        left = sorted(p.name for p in disk.rglob("*") if p.is_file())
    assert done.returncode != 0 and "embed" not in jobs_run(done)
    (refused,) = [line for line in done.stderr.splitlines() if "the attention maps need" in line]
    assert (
        f"at {disk} (the store's " in refused and "of kept pieces beside their parts)" in refused
    )
    assert "Traceback" not in done.stderr and not [n for n in left if n.endswith(".h5")]
