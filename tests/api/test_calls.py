"""`esmshard.embed`: the workflow's numbers in the calling process, its errors in one line."""

import inspect
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from helpers import (
    CONFIG_SCHEMA,
    MODEL,
    PROTEINS,
    PROTEOME,
    TINY_MODEL,
    config,
    read_records,
    snakemake,
)

import esmshard
from esmshard.config import ConfigError
from esmshard.input.fasta import FastaError
from esmshard.input.sizing import cpu_memory_problem, host_memory_bytes
from esmshard.models import ModelError, parse_spec
from esmshard.store import Store, verify

RECORDS = {header[1:].split()[0]: sequence for header, sequence in read_records(PROTEINS)}


def ctrl_c_as_in_a_terminal():
    """Ctrl-C's default action in the child, whatever the suite's parent left ignored (a
    background job of a script ignores SIGINT, and Python then never raises KeyboardInterrupt)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.fixture(scope="module")
def workflow_run(tmp_path_factory):
    """The same proteins through the `snakemake` command line, as users run them."""
    workdir = tmp_path_factory.mktemp("workflow")
    outdir = workdir / "results"
    snakemake(workdir, {}, *config(PROTEINS, outdir, "repr_layers=[-1,3]", "include=[mean,bos]"))
    with h5py.File(outdir / "embeddings.h5") as h5:
        ids = h5["ids"].asstr()[:].tolist()
        return ids, {name: h5[name][:] for name in ("mean/6", "mean/3", "bos/6")}


def test_a_mapping_gives_a_snakemake_runs_numbers(workflow_run, tmp_path):
    ids, want = workflow_run
    store = tmp_path / "store"
    got = esmshard.embed(RECORDS, MODEL, repr_layers=(-1, 3), include=("mean", "bos"), store=store)
    assert got.ids() == ids and got.failed == {}
    for name, values in want.items():
        kind, layer = name.split("/")
        assert np.abs(got.array(kind, int(layer)) - values).max() <= 1e-5
    assert np.array_equal(got[ids[0]].mean[6], got.array("mean")[0])
    # Pairs, or the FASTA file itself, with the same store: nothing is computed again.
    parts = sorted(store.rglob("*.h5"))
    same = {"repr_layers": [-1, 3], "include": ["mean", "bos"], "store": store}
    again = esmshard.embed(list(RECORDS.items())[:5], MODEL, **same)
    assert again.ids() == ids[:5] and np.array_equal(again.array("mean"), got.array("mean")[:5])
    from_file = esmshard.embed(str(PROTEINS), MODEL, **same)
    assert np.array_equal(from_file.array("bos"), got.array("bos"))
    assert sorted(store.rglob("*.h5")) == parts


def test_long_sequences_and_failures_follow_the_workflows_settings():
    long_id = max(RECORDS, key=lambda i: len(RECORDS[i]))
    assert len(RECORDS[long_id]) > 1022
    got = esmshard.embed({long_id: RECORDS[long_id]}, MODEL, long_sequences="skip")
    assert len(got) == 0 and "1022" in got.failed[long_id]
    assert repr(got) == f"<Embeddings of 0 proteins by {MODEL}: mean (layer 6); 1 failed>"
    truncated = esmshard.embed({long_id: RECORDS[long_id]}, MODEL, truncation_seq_length=100)
    assert truncated[long_id].length == 100
    assert repr(truncated) == f"<Embeddings of 1 protein by {MODEL}: mean (layer 6)>"
    assert repr(esmshard.embed("M", MODEL)["0"]) == "<Protein '0', 1 residue: mean (layer 6)>"


@pytest.mark.parametrize(
    "sequences, model, settings, error, words",
    [
        ({"P1": ""}, MODEL, {}, ValueError, "sequence P1 is empty"),
        ({"P1": "ACGTTGCAACGTTGCAACGTAC"}, MODEL, {}, ValueError, "looks like nucleotides"),
        ({"P1": "MKV1"}, MODEL, {}, FastaError, "character '1' is not an amino-acid letter"),
        ([("P1", "MKV"), ("P1", "MKL")], MODEL, {}, ValueError, "ID P1 is given twice"),
        ({}, MODEL, {}, ValueError, "sequences: none were given"),
        ({"P1": "MKV"}, "esm3_huge", {}, ModelError, "not a model name esmshard knows"),
        ({"P1": "MKV"}, MODEL, {"precision": "fp4"}, ConfigError, "precision: fp4 is not valid"),
        ("no/such.fasta", MODEL, {}, FastaError, "no/such.fasta: does not exist"),
        ({"P1": "MKV"}, "random:esmc_300m", {"include": ["contacts"]}, ConfigError, "contact"),
        (None, MODEL, {}, TypeError, "sequences: NoneType is not sequences; give a FASTA"),
        (
            {"P1": "MKV"},
            MODEL,
            {"repr_layers": "abc"},
            ConfigError,
            "repr_layers: [abc]: abc is not valid",
        ),
        ({"P1": "MKV"}, MODEL, {"repr_layers": [9]}, ConfigError, "layer 9 does not exist"),
        (["MKV", ""], MODEL, {}, ValueError, "sequence 1 is empty"),
        ("", MODEL, {}, ValueError, "sequences: an empty string"),
        (b"MKV", MODEL, {}, TypeError, "sequences: bytes is not sequences"),
        ([1, 2], MODEL, {}, ValueError, "sequences: item 1 is neither a sequence nor an (ID,"),
        (["MKVLAAGIV", 5], MODEL, {}, ValueError, "sequences: item 2 is 5, not a sequence"),
        (["MKVLAAGIV", None], MODEL, {}, ValueError, "sequences: item 2 is None, not a sequence"),
        ([("P1", "MKVLA"), "MK"], MODEL, {}, ValueError, "item 2 is the text MK, not an (ID,"),
        (
            "MKVLAAGIV1GLLLAQ",
            MODEL,
            {},
            FastaError,
            "the sequence given: character '1' is not an amino-acid letter (and no file has",
        ),
        ("MKVLAÄGIV", MODEL, {}, FastaError, "character 'Ä' (U+00C4) is not an amino-acid"),
    ],
    ids=[
        "empty",
        "dna",
        "letter",
        "repeated-id",
        "none",
        "model",
        "setting",
        "file",
        "contacts",
        "None",
        "layers-text",
        "layer-99",
        "list-item",
        "empty-text",
        "bytes",
        "numbers",
        "a-number-among-sequences",
        "none-among-sequences",
        "text-among-pairs",
        "a-digit",
        "non-ascii",
    ],  # fmt: skip
)
def test_bad_input_is_one_line_naming_it(sequences, model, settings, error, words):
    with pytest.raises(error) as raised:
        esmshard.embed(sequences, model, **settings)
    message = str(raised.value)
    assert words in message and "\n" not in message


def test_the_signature_names_every_setting_with_the_workflows_defaults():
    """help() and autocompletion show each keyword; its default is the config's."""
    keywords = dict(inspect.signature(esmshard.embed).parameters)
    # keep_every is for runs: a stopped call keeps what it finished as a part instead; variant
    # effects are a run's variant_scores.tsv (a call returns the scores they come from); the
    # neighbours are a run's step after its merge (a call's result searches with `nearest`)
    runs_only = {"input", "outdir", "keep_every", "variants", "variant_scoring", "variant_offset"}
    runs_only |= {key for key in CONFIG_SCHEMA["properties"] if key.startswith("neighbours")}
    assert set(keywords) == set(CONFIG_SCHEMA["properties"]) - runs_only | {"sequences"}
    for name, parameter in keywords.items():
        if name not in ("sequences", "store"):
            default = parameter.default
            default = list(default) if isinstance(default, tuple) else default
            assert default == CONFIG_SCHEMA["properties"][name]["default"], name
    assert "repr_layers: layers to return" in inspect.getdoc(esmshard.embed)
    with pytest.raises(TypeError, match="unexpected keyword argument 'outdir'"):
        esmshard.embed("MKTAYIAKQR", MODEL, outdir="out")


def test_a_pandas_series_keeps_its_index_as_the_ids():
    import pandas as pd

    one, two = list(RECORDS.values())[:2]
    got = esmshard.embed(pd.Series({"P1": one, "P2": two}), MODEL)
    assert got.ids() == ["P1", "P2"]


@pytest.mark.parametrize("names", [("id", "sequence"), ("ID", "seq"), ("name", "Sequence")])
def test_a_dataframe_of_ids_and_sequences_is_embedded_by_its_columns(names):
    """A notebook's table: its rows embedded under their IDs, the columns never as proteins,
    the numbers those of the same mapping."""
    import pandas as pd

    some = dict(list(RECORDS.items())[:3])
    table = pd.DataFrame({names[0]: list(some), names[1]: list(some.values()), "organism": "x"})
    got = esmshard.embed(table, MODEL)
    assert got.ids() == list(some)
    assert np.abs(got.array("mean") - esmshard.embed(some, MODEL).array("mean")).max() <= 1e-5


def test_a_dataframe_indexed_by_its_ids_is_embedded_under_them():
    """`df.set_index("id")`, as pandas users keep a table: the index holds the IDs."""
    import pandas as pd

    some = dict(list(RECORDS.items())[:2])
    table = pd.DataFrame({"sequence": list(some.values())}, index=pd.Index(list(some), name="id"))
    assert esmshard.embed(table, MODEL).ids() == list(some)


def test_a_table_without_id_and_sequence_columns_or_bytes_not_utf8_are_refused():
    import pandas as pd

    table = pd.DataFrame({"protein": ["P1"], "aa": ["MKTAYIAKQR"]})
    with pytest.raises(ValueError) as raised:
        esmshard.embed(table, MODEL)
    assert str(raised.value) == (
        "sequences: a table with the columns protein, aa: esmshard takes a DataFrame with a "
        "sequence column (sequence or seq) and an ID column (id or name) or the IDs as its "
        "index; rename them, or pass dict(zip(ids, sequences))"
    )
    # a sequence column, but only the default index (0, 1, ...): no IDs to take
    with pytest.raises(ValueError, match="or the IDs as its index"):
        esmshard.embed(pd.DataFrame({"sequence": ["MKTAYIAKQR"]}), MODEL)
    with pytest.raises(ValueError, match=r"^sequences: item 1's ID b'P\\xff' is bytes that are "):
        esmshard.embed({b"P\xff": "MKTAYIAKQR"}, MODEL)


def test_bytes_ids_are_decoded_as_utf8():
    got = esmshard.embed({b"P1": "MKTAYIAKQR", "P\u00e9".encode(): "MSHHWGYGKH"}, MODEL)
    assert got.ids() == ["P1", "P\u00e9"]
    assert esmshard.embed([(b"P3", "MKTAYIAKQR")], MODEL).ids() == ["P3"]


def test_a_model_too_large_for_this_machines_memory_is_refused_before_it_is_built():
    """ESM C 6B (fp32 weights alone 24 GB) on a CPU machine of 24 GiB, as a run's start
    refuses it: one line, before any weight is made (the call returns in seconds)."""
    spec = parse_spec("random:esmc_6b")
    if cpu_memory_problem(spec.name, spec.params, host_memory_bytes()) is None:
        pytest.skip("this machine has the memory for ESM C 6B on its CPU")
    started = time.monotonic()
    with pytest.raises(ModelError) as raised:
        esmshard.embed({"P1": "MKTAYIAKQR"}, "random:esmc_6b")
    assert time.monotonic() - started < 30
    message = str(raised.value)
    assert message.startswith("model esmc_6b computes on the CPU here, where it needs about ")
    assert "run it on GPUs, on a machine with more memory, or with a smaller model" in message


def test_a_sequence_or_a_list_of_sequences_is_embedded_with_ids_by_order():
    one, two = list(RECORDS.values())[:2]
    got = esmshard.embed([one, two], MODEL)
    assert got.ids() == ["0", "1"]
    alone = esmshard.embed(one, MODEL)
    assert alone.ids() == ["0"]
    assert np.abs(alone["0"].mean[6] - got["0"].mean[6]).max() <= 1e-5  # batched alone


def test_a_runs_file_and_a_calls_result_read_alike(workflow_run, tmp_path):
    workdir = tmp_path / "run"
    snakemake(workdir, {}, *config(PROTEINS, workdir / "out", "long_sequences=skip"))
    on_disk = esmshard.open_embeddings(workdir / "out")
    in_memory = esmshard.embed(RECORDS, MODEL, long_sequences="skip")
    assert on_disk.failed == in_memory.failed and len(on_disk.failed) == 3
    assert on_disk.ids() == in_memory.ids() and on_disk.dim == in_memory.dim
    assert on_disk.layers == in_memory.layers


def test_a_calls_result_saved_is_exported_and_read_as_a_runs_outdir(tmp_path):
    """`emb.save(folder)`, then `esmshard export folder` as the docs show it: the numbers the
    call returned; a second save there, and an export that needs the run's input, refused in one
    line."""
    import pyarrow.parquet as pq

    got = esmshard.embed(RECORDS, MODEL, long_sequences="skip")
    assert got.save(tmp_path / "mine") == tmp_path / "mine"
    with pytest.raises(FileExistsError, match="mine exists; remove it or choose another folder"):
        got.save(tmp_path / "mine")
    done = subprocess.run(["esmshard", "export", "mine", "--format", "parquet", "--out",
                           "mine.parquet"], cwd=tmp_path, capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 0, done.stderr
    table = pq.read_table(tmp_path / "mine.parquet")
    assert table["id"].to_pylist() == got.ids()
    np.testing.assert_array_equal(np.stack(table["mean_6"].to_numpy(zero_copy_only=False)),
                                  got.array("mean"))  # fmt: skip
    with esmshard.open_embeddings(tmp_path / "mine") as saved:
        assert saved.failed == got.failed and len(saved.failed) == 3
    refused = subprocess.run(["esmshard", "export", "mine", "--format", "biotrainer", "--out",
                              "bt"], cwd=tmp_path, capture_output=True, text=True)  # fmt: skip
    assert refused.returncode == 1 and len(refused.stderr.splitlines()) == 1, refused.stderr
    assert "a saved esmshard.embed result has none" in refused.stderr


def test_in_memory_results_say_what_they_cannot_do():
    got = esmshard.embed({"P1": "MKTAYIAKQR"}, MODEL)
    with pytest.raises(KeyError, match="'P2' is not in these embeddings"):
        got["P2"]
    with pytest.raises(ValueError, match="held in memory"):
        got.dataset()


def test_store_maintenance_beside_a_live_call_is_refused_and_the_call_finishes(tmp_path):
    """`esmshard store --remove`, `--prune` (with and without --apply) and `--verify` while an
    esmshard.embed call writes its pieces into the store: each refused in one line naming the
    call, before it lists or touches anything; the call's numbers are right."""
    store = tmp_path / "store"
    snakemake(tmp_path, {}, *config(PROTEINS, tmp_path / "kept", "shards=1"))  # an outdir to keep
    some = dict(sorted(RECORDS.items(), key=lambda item: len(item[1]))[:12])
    fasta = tmp_path / "some.fasta"
    fasta.write_text("".join(f">{id_}\n{sequence}\n" for id_, sequence in some.items()))
    script = (
        "import esmshard, numpy, sys\n"
        f"emb = esmshard.embed({str(fasta)!r}, {MODEL!r}, store={str(store)!r}, shards=4,\n"
        "                     toks_per_batch=100)\n"
        "numpy.save(sys.argv[1], emb.array('mean'))\n"
    )
    # slow batches: the call writes its pieces long enough to act beside it, however busy
    # the machine
    slow = {**os.environ, "ESMSHARD_TEST_SECONDS_PER_BATCH": "1"}
    call = subprocess.Popen([sys.executable, "-c", script, str(tmp_path / "mean.npy")],
                            stderr=subprocess.PIPE, text=True, env=slow)  # fmt: skip
    deadline = time.monotonic() + 120
    while not (list(store.glob("*/*.h5")) and list(store.glob("*/.pieces/*"))):
        assert call.poll() is None and time.monotonic() < deadline
        time.sleep(0.02)  # the call holds its key, has written a part and writes its pieces
    (key,) = {p.name.split(".")[0] for p in store.glob(".locks/*.json")}
    kept = {p: p.read_bytes() for p in (tmp_path / "kept").rglob("*") if p.is_file()}
    esmshard_cli = [str(Path(sys.executable).parent / "esmshard"), "store", str(store)]
    for args, doing in ((["--remove", key], "remove"),
                        (["--prune", "--keep", str(tmp_path / "kept"), "--apply"], "prune"),
                        (["--prune", "--keep", str(tmp_path / "kept")], "prune"),
                        (["--verify"], "verify")):  # fmt: skip
        done = subprocess.run([*esmshard_cli, *args], capture_output=True, text=True)
        assert done.returncode == 1 and len(done.stderr.splitlines()) == 1, done.stderr
        assert done.stderr.startswith(f"esmshard store: cannot {doing} settings {key} of {store}")
        assert "esmshard.embed in" in done.stderr and "nothing was changed" in done.stderr
        assert done.stdout == ""  # refused before it lists anything: the call's pieces neither
    assert call.wait(timeout=300) == 0, call.stderr.read()
    alone = esmshard.embed(some, MODEL)
    assert np.abs(np.load(tmp_path / "mean.npy") - alone.array("mean")).max() <= 1e-5
    assert not list(store.glob(".locks/*.json"))  # released with the call
    assert {p: p.read_bytes() for p in (tmp_path / "kept").rglob("*") if p.is_file()} == kept


def test_a_killed_call_leaves_nothing_that_the_next_call_does_not_clean(tmp_path):
    store = tmp_path / "store"
    script = (
        "import esmshard\n"
        f"esmshard.embed({str(PROTEOME)!r}, 'random:{TINY_MODEL}', store={str(store)!r},\n"
        "               include=['mean', 'per_tok'], toks_per_batch=2048)\n"
    )
    call = subprocess.Popen([sys.executable, "-c", script])
    deadline = time.monotonic() + 120
    while not list(store.glob("*/.pieces/*/.*.tmp")):  # its open piece
        assert call.poll() is None and time.monotonic() < deadline
        time.sleep(0.02)
    call.kill()
    call.wait()
    esmshard.embed(["MKTAYIAKQRQISFVKSHFSRQ"], f"random:{TINY_MODEL}", store=store)
    left = [p for p in store.rglob("*") if p.name.endswith(".tmp") or p.name == ".pieces"]
    assert left == []


def test_a_stopped_call_keeps_what_it_finished_and_the_same_call_computes_the_rest(
    tmp_path, caplog
):
    """Ctrl-C of a notebook's call, midway through its one shard: what it finished stays in
    the store (a part of its own, which the store's check passes), it says so in one line, and
    the same call again computes only the rest, equal to a call without a store."""
    store = tmp_path / "store"
    some = dict(sorted(RECORDS.items(), key=lambda item: len(item[1]))[:12])
    script = (
        "import esmshard\n"
        f"esmshard.embed({some!r}, {MODEL!r}, store={str(store)!r}, toks_per_batch=100)\n"
    )
    slow = {**os.environ, "ESMSHARD_TEST_SECONDS_PER_BATCH": "1"}
    call = subprocess.Popen([sys.executable, "-c", script], stderr=subprocess.PIPE, text=True,
                            env=slow, preexec_fn=ctrl_c_as_in_a_terminal)  # fmt: skip
    deadline = time.monotonic() + 120
    while not list(store.glob("*/.pieces/*/.*.tmp")):  # its first batches written
        assert call.poll() is None and time.monotonic() < deadline
        time.sleep(0.02)
    time.sleep(1.5)
    call.send_signal(signal.SIGINT)
    said = call.communicate(timeout=120)[1]
    assert call.returncode != 0 and "KeyboardInterrupt" in said
    (line,) = [line for line in said.splitlines() if "esmshard.embed stopped" in line]
    kept = int(line.split("esmshard.embed stopped: ")[1].split()[0])
    assert 0 < kept < len(some)
    assert line.endswith(
        f" of the {len(some)} sequences it was computing are kept in the store {store}; call "
        "it again with this store to compute only the rest"
    )
    assert not list(store.rglob(".pieces")) and verify(Store(str(store))).damaged == []
    with caplog.at_level(logging.INFO, logger="esmshard"):
        again = esmshard.embed(some, MODEL, store=store, toks_per_batch=100)
    rest = len(some) - kept
    assert f"{kept} found in the store" in caplog.text and f"{rest} to compute" in caplog.text
    counts = f"{rest} computed ({rest} by this command, 0 kept from stopped jobs), {kept} from"
    assert counts in caplog.text
    alone = esmshard.embed(some, MODEL, toks_per_batch=100)
    assert again.ids() == alone.ids()
    assert np.abs(again.array("mean") - alone.array("mean")).max() <= 1e-5


def test_a_ctrl_c_while_a_call_imports_torch_lands_after_it_and_the_next_call_works():
    """A notebook's Ctrl-C in a first call's first seconds: torch cut short midway could never
    be imported again in that kernel; the interrupt lands once torch is whole."""
    script = (
        "import os, signal, sys, threading, esmshard\n"
        "embed = esmshard.embed\n"
        "assert 'torch' not in sys.modules\n"
        "threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGINT)).start()\n"
        "try:\n"
        f"    embed('MKTAYIAKQR', {MODEL!r})\n"
        "except KeyboardInterrupt:\n"
        "    print('interrupted; torch imported:', 'torch' in sys.modules)\n"
        f"print(embed('MKTAYIAKQR', {MODEL!r}).array('mean').shape)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          preexec_fn=ctrl_c_as_in_a_terminal)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines() == ["interrupted; torch imported: True", "(1, 32)"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine whose GPUs can be used")
def test_gpus_that_cannot_be_used_are_said_in_one_line_and_the_call_computes_on_the_cpu(caplog):
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    with caplog.at_level(logging.WARNING, logger="esmshard"):
        emb = esmshard.embed("MKTAYIAKQR", MODEL, gpus=[5])
    assert os.environ.get("CUDA_VISIBLE_DEVICES") == visible  # the caller's, as it was
    (said,) = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert said.startswith("esmshard.embed: gpus [5], but ") and said.endswith(
        ": computing on the CPU instead"
    )
    assert emb.array("mean").shape == (1, 32)


def test_a_problem_the_shard_step_finds_names_the_item_not_a_temporary_file():
    """long_sequences: fail over sequences given in memory: the record by its ID and place in
    the call, never the temporary FASTA file they were written to."""
    long_id, long_sequence = max(RECORDS.items(), key=lambda item: len(item[1]))
    given = {"P1": "MKTAYIAKQR", long_id: long_sequence}
    with pytest.raises(FastaError) as raised:
        esmshard.embed(given, MODEL, long_sequences="fail")
    message = str(raised.value)
    assert f"{long_id} ({len(long_sequence)} residues > 1022, item 2)" in message, message
    assert "esmshard-embed-" not in message and "sequences.fasta" not in message
    assert "then call esmshard.embed again" in message


def test_the_warning_of_a_truncated_sequence_names_the_item_not_a_temporary_file(caplog):
    long_id, long_sequence = max(RECORDS.items(), key=lambda item: len(item[1]))
    with caplog.at_level(logging.WARNING, logger="esmshard"):
        esmshard.embed({"P1": "MKTAYIAKQR", long_id: long_sequence}, MODEL)
    (said,) = [r.getMessage() for r in caplog.records if "longer than" in r.getMessage()]
    assert f"{long_id} ({len(long_sequence):,} residues, item 2): truncated" in said, said
    assert "esmshard-embed-" not in said and "sequences.fasta" not in said
