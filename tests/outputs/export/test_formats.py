"""`esmshard export`: each format read back by the library that consumes it, equal to
embeddings.h5, on runs made through the `snakemake` command line."""

import hashlib
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import weakref
from pathlib import Path

import h5py
import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
import torch
from helpers import MODEL, PROTEINS, fill, read_records, small_disk, snakemake

from esmshard.outputs import export as exports
from esmshard.outputs.export import blocks, parquet, pt_name

ESMSHARD = str(Path(sys.executable).parent / "esmshard")
RECORDS = read_records(PROTEINS)  # 40 real proteins, 3 longer than 1022 residues
IDS = [h[1:].split()[0] for h, _ in RECORDS]


@pytest.fixture(scope="module", params=["float32", "float16"])
def run(request, tmp_path_factory):
    """A run with every representation kind at two layers, typed as users type it."""
    workdir = tmp_path_factory.mktemp(f"export-{request.param}")
    # Two headers as some tools write them: the ID and the description apart by a tab
    tabbed = [(h.replace(" ", "\t", 1 + n) if n in (1, 2) else h, s)
              for n, (h, s) in enumerate(RECORDS)]  # fmt: skip
    (workdir / "proteins.fasta").write_text("".join(f"{h}\n{s}\n" for h, s in tabbed))
    snakemake(workdir, {}, "--config", "input=proteins.fasta", "outdir=out",
              f"model={MODEL}", "repr_layers=[-1,3]", "include=[mean,per_tok,bos]",
              f"output_dtype={request.param}")  # fmt: skip
    return workdir


def export(workdir, *args, check=True):
    result = subprocess.run([ESMSHARD, "export", "out", *args], cwd=workdir, capture_output=True,
                            text=True)  # fmt: skip
    if check:
        assert result.returncode == 0, result.stderr
    return result


def stored(workdir):
    """embeddings.h5 as plain arrays: {name: array}, ids, headers, per-residue offsets."""
    with h5py.File(workdir / "out" / "embeddings.h5") as h5:
        arrays = {f"{kind}/{layer}": h5[kind][layer][:] for kind in ("mean", "per_tok", "bos")
                  for layer in ("3", "6")}  # fmt: skip
        return (arrays, h5["ids"].asstr()[:].tolist(), h5["headers"].asstr()[:].tolist(),
                h5["per_tok/offsets"][:])  # fmt: skip


def test_per_protein_h5_is_keyed_as_biotrainer_keys_it(run):
    result = export(run, "--format", "per-protein-h5", "--out", "biotrainer.h5")
    assert "40/40 proteins (100%)" in result.stderr
    arrays, ids, _, _ = stored(run)
    with h5py.File(run / "biotrainer.h5") as h5:
        assert len(h5) == 40
        for row, (_, sequence) in enumerate(RECORDS):
            # biotrainer's hash of the sequence as the FASTA holds it
            key = hashlib.sha256(f"{sequence}_{len(sequence)}".encode()).hexdigest()
            assert h5[key].attrs["original_id"] == ids[row]
            assert h5[key].dtype == arrays["mean/6"].dtype
            np.testing.assert_array_equal(h5[key][:], arrays["mean/6"][row])


def test_per_protein_h5_by_id_holds_the_chosen_kind_and_layer(run):
    done = export(run, "--format", "per-protein-h5", "--key", "id", "--kind", "per_tok",
                  "--layer", "-4", "--out", "by_id.h5")  # fmt: skip
    # per residue: the three proteins over 1022 residues have fewer rows, said in one line
    (warning,) = [line for line in done.stderr.splitlines() if "warning" in line]
    assert warning.startswith("esmshard export: warning: 3 records were truncated")
    assert "their rows in the export cover the residues embedded only" in warning
    arrays, ids, _, offsets = stored(run)
    with h5py.File(run / "by_id.h5") as h5:
        assert sorted(h5) == sorted(ids)
        for row, id_ in enumerate(ids):  # -4 of a 6-layer model is layer 3
            expected = arrays["per_tok/3"][offsets[row] : offsets[row + 1]]
            np.testing.assert_array_equal(h5[id_][:], expected)


def test_pt_files_hold_fair_esm_extract_keys(run):
    export(run, "--format", "pt", "--out", "pt")
    arrays, ids, headers, offsets = stored(run)
    index = pd.read_csv(run / "pt" / "index.tsv", sep="\t")
    assert index["id"].tolist() == ids and len(list((run / "pt").glob("*.pt"))) == 40
    for row, (id_, name) in enumerate(zip(index["id"], index["file"])):
        result = torch.load(run / "pt" / name, weights_only=True)
        assert set(result) == {"label", "representations", "mean_representations",
                               "bos_representations", "esmshard"}  # fmt: skip
        assert result["label"] == headers[row]
        for layer in (3, 6):
            got = {key: result[key][layer] for key in ("representations", "mean_representations",
                                                       "bos_representations")}  # fmt: skip
            assert all(t.dtype == torch.float32 for t in got.values())
            per_tok = arrays[f"per_tok/{layer}"][offsets[row] : offsets[row + 1]]
            np.testing.assert_array_equal(got["representations"].numpy(), per_tok)
            np.testing.assert_array_equal(got["mean_representations"].numpy(),
                                          arrays[f"mean/{layer}"][row])  # fmt: skip
            np.testing.assert_array_equal(got["bos_representations"].numpy(),
                                          arrays[f"bos/{layer}"][row])  # fmt: skip


def test_npy_arrays_memory_map_and_match(run):
    export(run, "--format", "npy", "--out", "arrays")
    arrays, ids, _, offsets = stored(run)
    folder = run / "arrays"
    assert pd.read_csv(folder / "ids.tsv", sep="\t")["id"].tolist() == ids
    np.testing.assert_array_equal(np.load(folder / "per_tok_offsets.npy"), offsets)
    for name, expected in arrays.items():
        loaded = np.load(folder / f"{name.replace('/', '_')}.npy", mmap_mode="r")
        assert isinstance(loaded, np.memmap) and loaded.dtype == expected.dtype
        np.testing.assert_array_equal(loaded, expected)


# DuckDB has no 16-bit float: it reads float16 columns as FLOAT, each value exactly.
FLOAT32_ONLY = {"duckdb"}


def parquet_readers(folder: Path) -> dict[str, pd.DataFrame]:
    """The Parquet dataset in `folder` as each library that reads it in place reads it."""
    import duckdb
    import polars as pl
    import pyarrow.dataset as ds

    files = str(folder / "*.parquet")
    return {
        "pandas": pd.read_parquet(folder),
        "pyarrow.dataset": ds.dataset(folder, format="parquet").to_table().to_pandas(),
        "duckdb": duckdb.sql(f"SELECT * FROM read_parquet('{files}')").df(),
        "polars": pl.scan_parquet(files).collect().to_pandas(),
    }


def assert_parquet_equals_embeddings(folder: Path, workdir: Path):
    arrays, ids, _, offsets = stored(workdir)
    with h5py.File(workdir / "out" / "embeddings.h5") as h5:
        sha256 = [d.decode() for d in h5["sequence_sha256"]]
        lengths = h5["lengths"][:].tolist()
    for reader, table in parquet_readers(folder).items():
        assert table["id"].tolist() == ids, reader
        assert table["sequence_sha256"].tolist() == sha256, reader
        assert table["length"].tolist() == lengths, reader
        for name, expected in arrays.items():
            column = table[name.replace("/", "_")]
            if name.startswith("per_tok"):
                got = np.concatenate([np.stack(rows) for rows in column])
                assert [len(rows) for rows in column] == np.diff(offsets).tolist(), reader
            else:
                got = np.stack(column)
            np.testing.assert_array_equal(got, expected, err_msg=reader)
            assert got.dtype == expected.dtype or reader in FLOAT32_ONLY, (reader, got.dtype)


def test_parquet_is_a_dataset_with_a_row_per_protein(run):
    export(run, "--format", "parquet", "--out", "table.parquet")
    names = sorted(p.name for p in (run / "table.parquet").iterdir())
    assert names == ["part-00000.parquet"]
    assert_parquet_equals_embeddings(run / "table.parquet", run)
    # each vector a fixed-size list: Polars reads a column of them as one 2-D array, from the
    # folder by its name, as the docs show
    import polars as pl

    arrays, *_ = stored(run)
    table = pl.read_parquet(run / "table.parquet")
    for name, expected in arrays.items():
        if name.startswith("mean"):
            got = table[name.replace("/", "_")].to_numpy()
            assert got.shape == expected.shape and got.dtype == expected.dtype
            np.testing.assert_array_equal(got, expected)
    # the card in the schema, read as the docs show
    schema = pq.read_schema(run / "table.parquet" / "part-00000.parquet")
    card = json.loads(schema.metadata[b"esmshard"])
    with h5py.File(run / "out" / "embeddings.h5") as h5:
        assert (
            card["model"] == h5.attrs["model"] and card["settings_key"] == h5.attrs["settings_key"]
        )


def test_a_large_parquet_export_is_many_files_of_row_groups_read_in_place(run, monkeypatch):
    # What a large run gives, at 40 proteins: row groups of 7 proteins, a file for each.
    monkeypatch.setattr(blocks, "PROTEINS_PER_BLOCK", 7)
    monkeypatch.setattr(parquet, "PARQUET_FILE_BYTES", 1)
    exports.export(run / "out", "parquet", run / "parts.parquet", stream=io.StringIO())
    files = sorted((run / "parts.parquet").glob("part-*"))
    assert [f.name for f in files] == [f"part-{i:05d}.parquet" for i in range(6)]
    assert [pq.ParquetFile(f).metadata.num_rows for f in files] == [7] * 5 + [5]
    assert_parquet_equals_embeddings(run / "parts.parquet", run)


def test_export_refuses_to_overwrite_and_names_a_missing_run(run, tmp_path):
    (run / "taken.parquet").write_text("mine")
    taken = export(run, "--format", "parquet", "--out", "taken.parquet", check=False)
    assert taken.returncode == 1 and "taken.parquet exists" in taken.stderr
    assert (run / "taken.parquet").read_text() == "mine"
    missing = subprocess.run([ESMSHARD, "export", str(tmp_path), "--format", "npy", "--out",
                              str(tmp_path / "x")], capture_output=True, text=True)  # fmt: skip
    assert missing.returncode == 1 and "embeddings.h5 does not exist" in missing.stderr
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("fmt", ["per-protein-h5", "pt"])  # a file, a folder
def test_what_appears_under_the_name_while_an_export_runs_is_never_replaced(
    run, tmp_path, monkeypatch, fmt
):
    """A second export to the same --out, or the user's own file, lands while this export
    writes: theirs stays, and this one says so in one line and leaves nothing beside it."""
    out = tmp_path / "x"
    write = exports.FORMATS[fmt].write

    def meanwhile(emb, target, bar, options):
        write(emb, target, bar, options)
        out.write_text("mine")  # written by another program as this export finishes

    monkeypatch.setitem(exports.FORMATS, fmt, exports.FORMATS[fmt]._replace(write=meanwhile))
    with pytest.raises(exports.ExportError) as raised:
        exports.export(run / "out", fmt, out, stream=io.StringIO())
    assert str(raised.value) == (
        f"{out} appeared while this export ran (another export or program wrote it): it is "
        "left as it is, and this export is not kept; choose another --out"
    )
    assert out.read_text() == "mine" and [p.name for p in tmp_path.iterdir()] == ["x"]


def test_hash_keys_refuse_an_input_changed_since_the_run(run, tmp_path):
    moved = tmp_path / "run"
    subprocess.run(["cp", "-r", str(run), str(moved)], check=True)
    recorded = json.loads((moved / "out" / "run.json").read_text())
    (moved / "out" / "run.json").write_text(json.dumps({**recorded, "workdir": str(moved)}))
    (moved / "proteins.fasta").write_text("".join(f"{h}\n{s[::-1]}\n" for h, s in RECORDS))
    result = export(moved, "--format", "per-protein-h5", "--out", "b.h5", check=False)
    assert result.returncode == 1
    assert (
        f"record '{IDS[0]}' ({moved / 'proteins.fasta'}:1) has another sequence" in result.stderr
    )
    assert not (moved / "b.h5").exists()


def test_pt_names_are_safe_and_distinct():
    ids = ["sp|P0A7Z4|RPOA_ECOLI", "a/b", "a%2Fb", "..", ".hidden", "ümlaut", "x" * 300,
           "x" * 299 + "y", "A B", "A_B"]  # fmt: skip
    names = [pt_name(i) for i in ids]
    assert len(set(names)) == len(ids)
    for name in names:
        assert "/" not in name and not name.startswith(".") and len(name.encode()) <= 200
    assert pt_name("sp|P0A7Z4|RPOA_ECOLI") == "sp%7CP0A7Z4%7CRPOA_ECOLI"


def test_a_disk_that_fills_during_an_export_is_one_line_and_the_same_command_then_works(
    run, tmp_path
):
    """HDF5 once crashed with a segmentation fault after its failed write (per-protein-h5)."""
    with small_disk(tmp_path / "disk", 1) as disk:
        fill(disk, 8 << 10)  # room for the file's first blocks, not for 40 proteins' datasets
        typed = ["--format", "per-protein-h5", "--out", f"{disk}/biotrainer.h5"]
        full = export(run, *typed, check=False)
        assert full.returncode == 1 and "Segmentation" not in full.stderr
        last = full.stderr.splitlines()[-1]  # after the progress bar
        assert last.startswith(f"esmshard export: no space left for {disk}/biotrainer.h5: ")
        assert "[Errno 28] No space left on device" in last and "Traceback" not in full.stderr
        assert [p.name for p in disk.iterdir()] == ["filler"]
        (disk / "filler").unlink()
        export(run, *typed)
        with h5py.File(disk / "biotrainer.h5") as h5:
            assert len(h5) == 40


def test_ids_with_control_characters_from_an_earlier_version_are_escaped_in_tsvs(run, tmp_path):
    """Earlier versions let an escape sequence into IDs; inputs with one are refused now."""
    shutil.copytree(run / "out", tmp_path / "out")
    with h5py.File(tmp_path / "out" / "embeddings.h5", "r+") as h5:
        h5["ids"][0] = "P1\x1b[2J"  # would clear the terminal
    for fmt, tsv in (("pt", "pt/index.tsv"), ("npy", "npy/ids.tsv")):
        export(tmp_path, "--format", fmt, "--out", fmt)
        text = (tmp_path / tsv).read_text()
        assert "\x1b" not in text and text.splitlines()[1].startswith("P1\\x1b[2J\t")
    assert (tmp_path / "pt" / "P1%1B%5B2J.pt").is_file()


def test_pt_named_by_header_loads_with_fair_esms_own_loader(run):
    """fair-esm's documented loader (its examples' notebook): `{EMB_PATH}/{header}.pt` for each
    header esm.data.read_fasta gives, a '/' in three of these headers making subfolders."""
    import esm

    export(run, "--format", "pt", "--names", "header", "--out", "pt_headers")
    arrays, ids, headers, _ = stored(run)
    EMB_PATH = run / "pt_headers"
    found = 0
    for row, (header, _seq) in enumerate(esm.data.read_fasta(str(run / "proteins.fasta"))):
        fn = f"{EMB_PATH}/{header}.pt"
        embs = torch.load(fn)
        assert embs["label"] == header == headers[row]
        np.testing.assert_array_equal(
            embs["mean_representations"][6].numpy(), arrays["mean/6"][row]
        )
        found += 1
    assert found == 40 and sum("/" in h for h in headers) == 3
    assert [h.count("\t") for h in headers[:4]] == [
        0,
        2,
        3,
        0,
    ]  # tabs kept, as fair-esm keeps them
    index = pd.read_csv(EMB_PATH / "index.tsv", sep="\t")
    assert index["id"].tolist() == ids and index["file"].tolist() == [f"{h}.pt" for h in headers]


@pytest.mark.parametrize(
    "args, said",
    [
        (["--format", "parquet", "--kind", "per_tok", "--layer", "3"],
         "--kind applies to --format per-protein-h5 only, not parquet: leave it out; --layer "
         "applies to --format per-protein-h5 and biotrainer only, not parquet: leave it out"),
        (["--format", "npy", "--key", "id"],
         "--key applies to --format per-protein-h5 only, not npy: leave it out"),
        (["--format", "per-protein-h5", "--names", "header"],
         "--names applies to --format pt only, not per-protein-h5: leave it out"),
    ],
)  # fmt: skip
def test_an_option_the_format_does_not_read_is_refused_by_name(run, args, said):
    done = export(run, *args, "--out", "refused", check=False)
    assert done.returncode == 1 and done.stderr == f"esmshard export: {said}\n"
    assert not (run / "refused").exists()


@pytest.mark.parametrize(
    "header, why",
    [("../escape", "outside the export"), ("a//b", "outside the export"),
     ("x" * 300, "over 255 bytes")],
)  # fmt: skip
def test_a_header_that_cannot_be_a_path_inside_the_export_is_refused(header, why):
    with pytest.raises(exports.ExportError, match=why) as err:
        exports.header_path(header)
    assert "--names id" in str(err.value)
    assert exports.header_path("sp|P1|X a/b c") == "sp|P1|X a/b c.pt"


def test_h5ad_opens_with_anndata_a_row_per_protein(run):
    import anndata

    export(run, "--format", "h5ad", "--out", "embeddings.h5ad")
    arrays, ids, _, offsets = stored(run)
    adata = anndata.read_h5ad(run / "embeddings.h5ad")
    assert adata.n_obs == 40 and adata.n_vars == 0 and adata.obs_names.tolist() == ids
    assert adata.obs["length"].tolist() == np.diff(offsets).tolist()
    assert adata.obs["truncated"].sum() == 3  # the three proteins over 1022 residues
    assert sorted(adata.obsm) == ["bos_3", "bos_6", "mean_3", "mean_6"]  # per_tok left out
    for name in adata.obsm:
        kind, layer = name.split("_")
        np.testing.assert_array_equal(adata.obsm[name], arrays[f"{kind}/{layer}"])
    with h5py.File(run / "out" / "embeddings.h5") as h5:  # the card says which model made it
        for key in ("model", "weights_sha256", "settings_key"):
            assert adata.uns["esmshard"][key] == h5.attrs[key]
        assert adata.uns["esmshard"]["num_layers"] == h5.attrs["num_layers"] == 6  # a number
        headers = h5["headers"].asstr()[:]
    # the header's words after the ID (a tab after it, as one header has, is no word)
    assert [d.split() for d in adata.obs["description"]] == [h.split()[1:] for h in headers]
    assert any("\t" in d for d in adata.obs["description"])  # kept inside the description


def biotrainer_read_fasta(path) -> list[tuple[str, dict, str]]:
    """biotrainer 1.4's input_files.read_FASTA as it reads a file (its documented input): per
    record the header's first word, its NAME=value attributes, and the record's last line as its
    sequence (one line per sequence, or the rest is lost)."""
    records, attributes = [], re.compile(r"([A-Z_]+)=([^ ]+)")
    for line in Path(path).read_text().splitlines():
        line = line.strip()
        if line.startswith(">"):
            header = line[1:].strip().split(maxsplit=1)
            records.append([header[0], dict(attributes.findall(header[-1])), ""])
        elif line:
            records[-1][2] = line
    return [tuple(r) for r in records]


def test_the_biotrainer_export_is_found_whole_by_biotrainers_reader(run):
    done = export(run, "--format", "biotrainer", "--layer", "3", "--out", "bt")
    arrays, ids, _, offsets = stored(run)
    records = biotrainer_read_fasta(run / "bt" / "sequences.fasta")
    assert [r[0] for r in records] == ids and records[0][1]["OS"] == "Escherichia"
    with (
        h5py.File(run / "bt" / "embeddings_per_protein.h5") as per_protein,
        h5py.File(run / "bt" / "embeddings_per_residue.h5") as per_residue,
    ):
        for row, (id_, _, sequence) in enumerate(records):
            assert sequence == RECORDS[row][1]  # the residues, on one line
            # biotrainer's utilities.calculate_sequence_hash, and its load_embeddings' lookup
            key = hashlib.sha256(f"{sequence}_{len(sequence)}".encode()).hexdigest()
            assert per_protein[key].attrs["original_id"] == id_
            np.testing.assert_array_equal(per_protein[key][:], arrays["mean/3"][row])
            rows = arrays["per_tok/3"][offsets[row] : offsets[row + 1]]
            np.testing.assert_array_equal(per_residue[key][:], rows)
    # three proteins of over 1022 residues: fewer rows than residues, said in one line
    (warning,) = [line for line in done.stderr.splitlines() if "warning" in line]
    assert warning.startswith("esmshard export: warning: 3 records were truncated")


def test_an_export_from_another_folder_reads_the_runs_own_inputs(run, tmp_path):
    """The run read `proteins.fasta` in its own folder; an export typed in another folder, one
    that holds another `proteins.fasta`, reads the run's (its relative path starts where the run
    ran), and gives the keys an export beside the run gives."""
    (tmp_path / "proteins.fasta").write_text("".join(f"{h}\nMKV\n" for h, _ in RECORDS))
    mine = (tmp_path / "proteins.fasta").read_bytes()
    done = subprocess.run([ESMSHARD, "export", str(run / "out"), "--format", "per-protein-h5",
                           "--out", "elsewhere.h5"], cwd=tmp_path, capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 0, done.stderr
    export(run, "--format", "per-protein-h5", "--out", "beside.h5")
    with h5py.File(tmp_path / "elsewhere.h5") as got, h5py.File(run / "beside.h5") as want:
        assert sorted(got) == sorted(want) and len(got) == 40
    assert (tmp_path / "proteins.fasta").read_bytes() == mine


class SignalAtFirstLine(io.StringIO):
    """The progress bar's stream: at the bar's first line, a real SIGINT lands in a finalizer
    (where Python drops the exception, as in h5py's weakref callbacks)."""

    def write(self, text):
        if not self.getvalue():
            holder = type("Held", (), {})()
            weakref.finalize(holder, os.kill, os.getpid(), signal.SIGINT)
            del holder  # the finalizer runs now, the signal's KeyboardInterrupt inside it
        return super().write(text)


@pytest.mark.parametrize("fmt", ["pt", "per-protein-h5"])
def test_ctrl_c_stops_an_export_even_inside_a_finalizer_and_leaves_nothing(
    run, tmp_path, monkeypatch, fmt
):
    monkeypatch.setattr(blocks, "PROTEINS_PER_BLOCK", 7)  # blocks after the first line
    before = signal.getsignal(signal.SIGINT)
    out, stop = tmp_path / "x", exports.Stop()
    with pytest.raises(KeyboardInterrupt), exports.stoppable(stop):
        exports.export(run / "out", fmt, out, stream=SignalAtFirstLine())
    assert stop.signal == signal.SIGINT and stop.signals == [signal.SIGINT]
    assert list(tmp_path.iterdir()) == []  # neither the export nor its temporary
    assert signal.getsignal(signal.SIGINT) is before  # the caller's handlers back
