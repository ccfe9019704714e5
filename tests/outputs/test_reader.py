"""esmshard.open_embeddings on a run made through the `snakemake` command line."""

import os

import h5py
import numpy as np
import pytest
import torch
from helpers import MODEL, PROTEINS, read_records, snakemake

import esmshard
from esmshard.embeddings_h5.id_index import id_hash, id_hashes, write_id_index

IDS = [h[1:].split()[0] for h, _ in read_records(PROTEINS)]


@pytest.fixture(scope="module")
def outdir(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("reader")
    snakemake(workdir, {}, "--config", f"input={PROTEINS}", "outdir=out",
              f"model={MODEL}", "repr_layers=[-1,3]", "include=[mean,per_tok,bos]")  # fmt: skip
    return workdir / "out"


@pytest.fixture(scope="module")
def stored(outdir):
    with h5py.File(outdir / "embeddings.h5") as h5:
        return {name: h5[name][:] for name in ("mean/6", "mean/3", "per_tok/6", "per_tok/offsets",
                                               "bos/3", "lengths")}  # fmt: skip


def test_a_protein_by_id_holds_every_kind_and_layer(outdir, stored):
    with esmshard.open_embeddings(outdir) as emb:  # the outdir or its embeddings.h5
        assert len(emb) == 40 and emb.ids() == IDS and emb.layers["mean"] == [3, 6]
        row = 7
        protein = emb[IDS[row]]
        assert protein.id == IDS[row] and protein.length == stored["lengths"][row]
        np.testing.assert_array_equal(protein.mean[6], stored["mean/6"][row])
        np.testing.assert_array_equal(protein.bos[3], stored["bos/3"][row])
        start, stop = stored["per_tok/offsets"][row : row + 2]
        np.testing.assert_array_equal(protein.per_tok[6], stored["per_tok/6"][start:stop])
        np.testing.assert_array_equal(
            emb.per_residue(IDS[row], -1), stored["per_tok/6"][start:stop]
        )
        assert protein.contacts is None and IDS[0] in emb and "nope" not in emb
        with pytest.raises(KeyError, match="'nope' is not in"):
            emb["nope"]
        # an ID read from bytes that are not UTF-8 (os.fsdecode's lone surrogates) is not there
        lone = os.fsdecode(b"sp|P\xff|X")
        assert lone not in emb
        with pytest.raises(KeyError, match="is not in"):
            emb[lone]


def test_what_a_notebook_shows_is_what_is_held_in_a_line(outdir):
    """The file and a protein shown by what they hold, not by their arrays (a protein's repr
    was every array of every layer)."""
    with esmshard.open_embeddings(outdir) as emb:
        assert repr(emb) == (
            f"<Embeddings of 40 proteins by {MODEL}: mean (layers 3, 6), per_tok "
            f"(layers 3, 6), bos (layers 3, 6) in {outdir / 'embeddings.h5'}>"
        )
        protein = emb[IDS[7]]
        assert repr(protein) == (
            f"<Protein {IDS[7]!r}, {protein.length:,} residues: mean (layers 3, 6), bos (layers 3, "
            "6), per_tok (layers 3, 6)>"
        )
    assert repr(emb) == f"<Embeddings in {outdir / 'embeddings.h5'}, closed>"


def test_a_layer_is_memory_mapped_and_named_as_in_fair_esm(outdir, stored):
    with esmshard.open_embeddings(outdir / "embeddings.h5") as emb:
        means = emb.array("mean")  # the highest layer
        assert isinstance(means, np.memmap)
        np.testing.assert_array_equal(means, stored["mean/6"])
        np.testing.assert_array_equal(emb.array("mean", -4), stored["mean/3"])  # 6 layers
        np.testing.assert_array_equal(emb.array("per_tok", 6), stored["per_tok/6"])
        np.testing.assert_array_equal(emb.offsets, stored["per_tok/offsets"])
        with pytest.raises(KeyError, match=r"at layers \[3, 6\], not at 5"):
            emb.array("mean", 5)


def test_batches_cover_every_protein_in_input_order(outdir, stored):
    with esmshard.open_embeddings(outdir) as emb:
        batches = list(emb.batches("mean", 3, size=16))
        assert [b.start for b in batches] == [0, 16, 32]
        assert sum((b.ids for b in batches), []) == IDS
        np.testing.assert_array_equal(
            np.concatenate([b.values for b in batches]), stored["mean/3"]
        )
        residues = list(emb.batches("per_tok", size=16))
        offsets = stored["per_tok/offsets"]
        assert residues[1].offsets.tolist() == (offsets[16:33] - offsets[16]).tolist()
        np.testing.assert_array_equal(
            np.concatenate([b.values for b in residues]), stored["per_tok/6"]
        )


def test_a_torch_dataset_feeds_a_data_loader_with_workers(outdir, stored):
    with esmshard.open_embeddings(outdir) as emb:
        means = emb.dataset("mean")
        residues = emb.dataset("per_tok", -1)
    assert isinstance(means, torch.utils.data.Dataset) and len(means) == 40
    loader = torch.utils.data.DataLoader(means, batch_size=16, num_workers=2)
    ids, rows = zip(*loader)
    assert sum(map(list, ids), []) == IDS
    np.testing.assert_array_equal(torch.cat(rows).numpy(), stored["mean/6"])
    id_, tokens = residues[2]
    start, stop = stored["per_tok/offsets"][2:4]
    assert id_ == IDS[2] and tokens.shape == (stop - start, 32)  # the micro model's width


def test_compressed_datasets_are_read_rather_than_mapped(tmp_path):
    path = tmp_path / "embeddings.h5"
    with h5py.File(path, "w") as h5:
        h5.create_dataset(
            "ids", data=np.array(["a", "b"], dtype=object), dtype=h5py.string_dtype()
        )
        h5.create_dataset("mean/6", data=np.eye(2, 4, dtype=np.float32), compression="gzip")
    with esmshard.open_embeddings(path) as emb:
        means = emb.array("mean", 6)
        assert not isinstance(means, np.memmap)
        np.testing.assert_array_equal(means, np.eye(2, 4))


def test_ids_are_found_through_the_index_without_reading_every_id(tmp_path, monkeypatch):
    path = tmp_path / "embeddings.h5"
    ids = ["P0A7Z4", "sp|P12345|X_ECOLI", "Ünïcode-ID", "a", "b", "c" * 300]
    with h5py.File(path, "w") as h5:
        h5.create_dataset("ids", data=np.array(ids, dtype=object), dtype=h5py.string_dtype())
        write_id_index(h5, id_hashes(ids))
    # the vectorised hashes are the one-ID ones
    assert [int(h) for h in id_hashes(ids)] == [id_hash(i) for i in ids]
    with esmshard.open_embeddings(path) as emb:
        monkeypatch.setattr(type(emb), "ids", lambda *a: pytest.fail("every ID was read"))
        assert [emb.row(i) for i in ids] == list(range(len(ids)))
        assert "P0A7Z" not in emb and "Z" not in emb and 5 not in emb
        with pytest.raises(KeyError, match="'P0A7Z' is not in"):
            emb.row("P0A7Z")


def test_equal_hashes_are_settled_by_the_ids_and_a_file_without_an_index_still_reads(tmp_path):
    path = tmp_path / "embeddings.h5"
    ids = ["first", "second", "third"]
    with h5py.File(path, "w") as h5:
        h5.create_dataset("ids", data=np.array(ids, dtype=object), dtype=h5py.string_dtype())
        # "second" and "third" given one hash, as two IDs of a colliding pair would have
        same = np.uint64(id_hash("third"))
        write_id_index(h5, np.array([id_hash("first"), same, same], dtype=np.uint64))
    with esmshard.open_embeddings(path) as emb:
        assert emb.row("third") == 2 and "second" not in emb  # its own hash is not listed
    with h5py.File(path, "a") as h5:
        del h5["id_index"]
    with esmshard.open_embeddings(path) as emb:
        assert [emb.row(i) for i in ids] == [0, 1, 2] and "fourth" not in emb
