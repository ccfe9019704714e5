"""`esmshard.embed`: embeddings in the calling process, by the workflow's own steps.

    emb = esmshard.embed({"P1": "MKTAYIAKQR", "P2": "MSHHWGYGKH"}, "esm2_t33_650M_UR50D")
    emb["P1"].mean[33]

The sequences go through the shard step (the same input checks, deduplication and store), one
embed job per shard on a device of the GPU pool (the same batching, precision, long-sequence
policy and out-of-memory back-off), and the merge step, in a temporary folder; the result is
read like `esmshard.open_embeddings` and held in memory. Settings take the workflow's config
keys and defaults (config/config.yaml), validated by the same schema.
"""

import contextlib
import io
import logging
import numbers
import os
import re
import signal
import sys
import tempfile
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path

import yaml

from ..compute.pool import no_usable_gpu
from ..config import ConfigError, embedding_settings
from ..files import unwritable, write_json
from ..input.fasta import (
    FIX_RECORD,
    FastaError,
    looks_nucleotide,
    normalise,
    not_a_file,
    printable,
)
from ..input.sizing import ModelSize, cpu_memory_problem, host_memory_bytes
from ..layout import Layout
from ..models import ModelError, attention_values, ensure_available, parse_spec
from ..outputs.reader import Embeddings, read_failed
from ..steps.checks import check_config, defaults
from ..steps.embed import run_shard
from ..steps.merge import merge
from ..steps.shard import write_shards
from ..store import Store, read_json_object, settings_key
from ..store.leftovers import remove_leftovers
from ..store.pieces import Pieces
from ..store.runlock import new_run
from ..store.storelock import shared
from .launch import workflow_root

Sequences = Mapping[str, str] | Iterable[tuple[str, str]] | Iterable[str] | str | os.PathLike
# A string that names no file and is made of these is one sequence, not a path.
SEQUENCE_TEXT = re.compile(r"[A-Za-z*\s-]+")
# What a path has and a sequence has not: a folder, or an extension.
PATH_LIKE = re.compile(r"[/\\]|\.[A-Za-z0-9]+$|^~")
# A table's columns of IDs and of sequences (pairs_of), by the names people give them.
TABLE_COLUMNS = (("id", "name"), ("sequence", "seq"))

log = logging.getLogger(__name__)


def schema() -> dict:
    with open(workflow_root() / "workflow" / "schemas" / "config.schema.yaml") as fh:
        return yaml.safe_load(fh)


def settings_of(options: dict, model) -> dict:
    """The workflow's config: its schema's defaults, then `options`, coerced and checked as a
    run's are (esmshard.steps.checks); ConfigError naming every setting that cannot work."""
    config_schema = schema()
    # Tuples, ranges and numpy arrays as the lists (of plain numbers) that the schema takes.
    lists = {
        key: [item.item() if hasattr(item, "item") else item for item in value]
        for key, value in options.items()
        if isinstance(value, Iterable) and not isinstance(value, (str, bytes, Mapping))
    }
    checked = check_config(
        {**defaults(config_schema), **options, **lists}, config_schema, inputs=False, model=model
    )
    if checked.problems:
        raise ConfigError("; ".join(checked.problems))
    return checked.config


def pairs_of(sequences) -> Iterable[tuple[str, str]]:
    """(ID, sequence) pairs of a mapping (a pandas Series by its index), of a table (a pandas
    DataFrame's ID and sequence columns), of pairs, or of sequences alone (IDs "0", "1", ...)."""
    if getattr(sequences, "ndim", None) == 2 and hasattr(sequences, "columns"):
        ids, texts = table_columns(sequences)
        return list(zip(map(named_id, ids), texts))
    if (
        isinstance(sequences, Mapping)
        or getattr(sequences, "ndim", None) == 1
        and hasattr(sequences, "index")
    ):  # a Series is no Mapping, but its index holds the IDs
        return [(named_id(id_), s) for id_, s in sequences.items()]
    if not isinstance(sequences, Iterable) or isinstance(sequences, (bytes, bytearray)):
        raise TypeError(
            f"sequences: {type(sequences).__name__} is not sequences; give a FASTA path, a "
            "sequence, a list of sequences, a mapping of ID to sequence, (ID, sequence) pairs, "
            "or a DataFrame with id and sequence columns"
        )
    items = list(sequences)
    texts = [isinstance(item, str) for item in items]
    if items and all(texts):
        return [(str(n), sequence) for n, sequence in enumerate(items)]
    if texts[0] if items else False:  # sequences, then something else: name that item
        n = texts.index(False)
        raise ValueError(
            f"sequences: item {n + 1} is {items[n]!r:.60}, not a sequence: a list of sequences "
            "holds text only"
        )
    for n, item in enumerate(items, 1):
        if isinstance(item, str):  # among pairs: a two-letter one would unpack as a pair
            raise ValueError(
                f"sequences: item {n} is the text {printable(item):.60}, not an (ID, sequence) "
                "pair like the first item"
            )
    return items


def table_columns(table) -> tuple[list, list]:
    """A DataFrame's IDs and sequences: its columns named as people name them (`id`, `ID` or
    `name`; `sequence` or `seq`, in any case), the IDs else its index where that is one of its
    own (`df.set_index("id")`: not the default 0, 1, ...), else ValueError naming its columns."""
    by_name = {str(column).lower(): column for column in table.columns}
    id_column, sequence_column = (
        next((by_name[n] for n in names if n in by_name), None) for names in TABLE_COLUMNS
    )
    labelled = type(table.index).__name__ != "RangeIndex"
    if sequence_column is None or id_column is None and not labelled:
        columns = ", ".join(printable(str(c)) for c in table.columns) or "none"
        raise ValueError(
            f"sequences: a table with the columns {columns:.200}: esmshard takes a DataFrame with "
            "a sequence column (sequence or seq) and an ID column (id or name) or the IDs as its "
            "index; rename them, or pass dict(zip(ids, sequences))"
        )
    ids = table.index.tolist() if id_column is None else table[id_column].tolist()
    return ids, table[sequence_column].tolist()


def named_id(id_):
    """A mapping's key or a table's ID as an ID: a number (a Series' default index) as text;
    text and bytes (decoded by text_id) as they are."""
    return str(id_) if isinstance(id_, numbers.Integral) else id_


def text_id(id_, n: int):
    """An ID as text: bytes decoded as UTF-8 (ValueError naming item `n` where they are not);
    anything else as given, checked by the caller."""
    if not isinstance(id_, (bytes, bytearray)):
        return id_
    try:
        return bytes(id_).decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(
            f"sequences: item {n}'s ID {bytes(id_)!r:.60} is bytes that are not UTF-8; give IDs "
            "as text"
        ) from None


def fasta_of(sequences: Sequences, folder: Path, nucleotide_check: bool) -> Path:
    """A FASTA path as given, or the sequences written as one (each ID checked first)."""
    if isinstance(sequences, str) and not sequences.strip():
        raise ValueError("sequences: an empty string; give a sequence, or a FASTA file's path")
    if isinstance(sequences, str) and not os.path.exists(os.path.expanduser(sequences)):
        if SEQUENCE_TEXT.fullmatch(sequences):
            sequences = ["".join(sequences.split())]  # one sequence, pasted
        elif PATH_LIKE.search(sequences) is None:  # no folder, no extension: a sequence
            try:
                normalise("".join(sequences.split()), "sequences: the sequence given")
            except FastaError as err:
                raise FastaError(
                    str(err).removesuffix(FIX_RECORD) + " (and no file has this name); fix it, "
                    "or give the path of a FASTA file"
                ) from None
    if isinstance(sequences, (str, os.PathLike)):
        path = Path(sequences).expanduser()
        problem = not_a_file(path)
        if problem:
            raise FastaError(f"{path}: {problem}")
        return path
    path = folder / "sequences.fasta"
    n, seen = 0, set()
    with open(path, "w") as fh:
        for n, pair in enumerate(pairs_of(sequences), 1):
            try:
                id_, sequence = pair
            except (TypeError, ValueError):
                raise ValueError(
                    f"sequences: item {n} is neither a sequence nor an (ID, sequence) pair: "
                    f"{pair!r:.60}"
                ) from None
            id_ = text_id(id_, n)
            if not isinstance(id_, str) or not id_ or any(c.isspace() for c in id_):
                raise ValueError(f"sequences: item {n}'s ID {id_!r:.60} is not one word of text")
            if id_ in seen:
                raise ValueError(f"sequences: item {n}'s ID {printable(id_)} is given twice")
            seen.add(id_)
            if not isinstance(sequence, str) or not sequence.strip():
                raise ValueError(f"sequence {printable(id_)} is empty (or not text)")
            normalise(sequence, f"sequence {printable(id_)}")  # the shard step's letters
            if nucleotide_check and looks_nucleotide(sequence):
                raise ValueError(
                    f"sequence {printable(id_)} looks like nucleotides (only A, C, G, T, U, N): "
                    "translate it first, or pass nucleotide_check=False to embed it anyway"
                )
            fh.write(f">{id_}\n{sequence}\n")
    if n == 0:
        raise ValueError("sequences: none were given")
    return path


def given_by_item(step, fasta: Path, tmp: Path):
    """`step` (the shard step), whose errors and log lines name the records of the FASTA file
    that `fasta_of` wrote into `tmp` (a temporary path) by the place the caller gave them:
    item N."""
    if fasta.parent != tmp:  # the caller's own file: named as it is
        return step

    def by_item(text: str) -> str:  # each record is two lines, its header first
        return re.sub(
            re.escape(str(fasta)) + r":(\d+)",
            lambda found: f"item {(int(found[1]) + 1) // 2}",
            text,
        )

    def said_by_item(record: logging.LogRecord) -> bool:
        record.msg, record.args = by_item(record.getMessage()), None
        return True

    def named(*args, **kwargs):
        said = logging.getLogger(step.__module__)
        said.addFilter(said_by_item)
        try:
            return step(*args, **kwargs)
        except FastaError as err:
            text = by_item(str(err)).replace(
                "then run the same command again", "then call esmshard.embed again"
            )
            raise FastaError(text) from None
        finally:
            said.removeFilter(said_by_item)

    return named


def imported_torch():
    """torch, imported whole: a Ctrl-C meanwhile lands once it is (a torch cut short midway
    cannot be imported again in the process, and every later call would fail on it)."""
    handler = signal.getsignal(signal.SIGINT)
    main = threading.current_thread() is threading.main_thread()
    if "torch" in sys.modules or handler is None or not main:  # a handler set outside Python
        import torch

        return torch
    arrived = []
    signal.signal(signal.SIGINT, lambda *_: arrived.append(True))
    try:
        import torch
    finally:
        signal.signal(signal.SIGINT, handler)
    if arrived:
        signal.raise_signal(signal.SIGINT)  # to the caller's handler: KeyboardInterrupt
    return torch


@contextlib.contextmanager
def saying_what_is_kept(store: Store, key: str, shards: list[str], computing: int):
    """Where the block stops (an exception), say what of the call's work `store` keeps: the
    parts of its `shards` that are in place."""
    try:
        yield
    except BaseException:
        manifests = [Path(store.manifest(key, shard)) for shard in shards]
        count = sum((read_json_object(m) or {}).get("n_sequences", 0) for m in manifests
                    if m.exists())  # fmt: skip
        if count:
            log.warning(
                "esmshard.embed stopped: %d of the %d sequences it was computing are kept in "
                "the store %s; call it again with this store to compute only the rest",
                count,
                computing,
                store.root,
            )
        raise


def embed(
    sequences: Sequences,
    model: str = "esm2_t33_650M_UR50D",
    *,
    repr_layers: Iterable[int] = (-1,),
    include: Iterable[str] = ("mean",),
    store: str | os.PathLike | None = None,
    precision: str = "auto",
    long_sequences: str = "truncate",
    score_windows: str = "weighted",
    truncation_seq_length: int | str = "auto",
    toks_per_batch: int | str = "auto",
    gpus: str | Iterable[int] = "auto",
    batching: str = "auto",
    compile: str | bool = "auto",
    fast_path: bool = True,
    nucleotide_check: bool = True,
    shards: int | str = "auto",
    output_dtype: str = "float32",
    output_values: str = "auto",
    contacts_dtype: str = "float16",
    per_residue_compression: str = "none",
    attention_layers: Iterable[int] = (-1,),
    attention_heads: str = "mean",
) -> Embeddings:
    """Embed `sequences` with `model` in this process, through the workflow's own shard, embed
    and merge steps, and return them read like `esmshard.open_embeddings`:

        emb = esmshard.embed({"P1": "MKTAYIAKQR"}, "esm2_t33_650M_UR50D", repr_layers=[-1, 6])
        emb["P1"].mean[33], emb.array("mean"), emb.ids(), emb.failed

    sequences: a FASTA file's path; one sequence as a string (ID "0"); a list of sequences (IDs
        "0", "1", ... in their order); a mapping of ID to sequence (bytes IDs read as UTF-8);
        (ID, sequence) pairs; or a pandas DataFrame with a sequence column (sequence or seq)
        and an ID column (id, ID or name) or the IDs as its index.
        A string that names no file and is made only of letters is a sequence.
    model: a fair-esm ESM-2 name, hf:<owner>/<name>, a model folder or checkpoint file, or
        random:<name> (seeded random weights of a published shape, offline).
    repr_layers: layers to return; negative count from the end (-1 the last), 0 the embeddings.
    include: any of "mean" (per protein), "per_tok" (per residue), "bos", "contacts" (ESM-2,
        ESM-1b), and the scores of ESM-2, ESM-1b/1v and ESM C: "logits", "masked_marginals", "pll"
        (emb["P1"].scores); "attentions", their attention maps at `attention_layers`, each
        head's or their mean (`attention_heads`: "all", "mean"; emb.attention_maps("P1")).
        Variant effects (`variants`) are for runs: variant_scores.tsv.
    store: a folder that keeps what is computed, so that a later call (or run) reuses it; None
        computes everything and keeps nothing.
    precision: "auto" (bf16 on GPUs that have it, else fp32), "fp32", "bf16", "fp16" or "fp8"
        (ESM-2's, ESM-1b/1v's and ESM C's dense products in FP8: docs/performance.md).
    long_sequences: beyond truncation_seq_length: "truncate", "chunk", "skip" or "fail".
    score_windows: with "chunk", the windows of a longer protein's logits: "weighted"
        (esm-variants) or "overlapping" (ProteinGym).
    truncation_seq_length: residues kept per sequence, or "auto" (the model family's limit).
    toks_per_batch: tokens per forward pass, or "auto" (sized to the device's free memory).
    gpus: "auto" (every visible GPU, else the CPU) or a list of CUDA device indices (where
        none of them can be used, a warning says why, and the call computes on the CPU).
    batching, compile, fast_path, nucleotide_check, shards, output_dtype, contacts_dtype,
    per_residue_compression: as the workflow's config keys (docs/configuration.md). A call
    stopped midway (Ctrl-C, an error) with a `store` keeps there what it finished: the same
    call again computes only the rest.
    output_values: the result holds its values in memory, whatever the size ("auto", "copy");
        "in_place" is for runs, whose embeddings.h5 can point into their store.

    The result's `failed` maps each sequence that could not be embedded to the reason. Bad
    input raises ValueError (esmshard.input.fasta.FastaError for a file), naming the item by its
    ID or place; a model that cannot be had esmshard.models.ModelError; settings that do not
    fit ConfigError, naming each setting.
    """
    # The keywords are config keys: taken as one mapping, checked as a run's config is.
    settings = {key: value for key, value in locals().items() if key != "sequences"}
    if output_values == "in_place":
        raise ConfigError(
            "output_values: in_place leaves a run's values in its store, for runs (esmshard "
            "run, snakemake); esmshard.embed returns them in memory: leave it out"
        )
    torch = imported_torch()
    with tempfile.TemporaryDirectory(prefix="esmshard-embed-") as tmp:
        tmp = Path(tmp)
        spec = parse_spec(str(model))
        options = {**settings, "model": str(model), "store": str(store or "")}
        options |= {"input": [str(tmp / "sequences.fasta")], "outdir": str(tmp / "out")}
        config = settings_of(options, spec)
        fasta = fasta_of(sequences, tmp, config["nucleotide_check"])
        if not torch.cuda.is_available():  # as a run's start says (RunStart.say_no_usable_gpu)
            too_large = cpu_memory_problem(spec.name, spec.params, host_memory_bytes())
            if too_large:
                raise ModelError(too_large.replace("an embed job needs", "it needs"))
            why = no_usable_gpu(config["gpus"])
            if why:
                log.warning("esmshard.embed: gpus %s, but %s: computing on the CPU instead",
                            config["gpus"], why)  # fmt: skip
        ensure_available(spec)
        run = Layout(config["outdir"])
        store = Store(config["store"] or str(tmp / "store"))
        params = embedding_settings(config, spec.family.name, spec.identity(run.checksums))
        key = settings_key(params)
        # The store's key held as a run holds it: maintenance beside the call is refused.
        kept = bool(config["store"]) and not unwritable(store.root)
        held = shared(store.root, key, f"esmshard.embed in {' '.join(sys.argv)}")
        with held if kept else contextlib.nullcontext(), contextlib.ExitStack() as stack:
            if kept:  # what killed calls and runs left in the store, as a run's start removes
                remove_leftovers(run.outdir, store)
            # the call is the command whose jobs' work merge counts as this command's
            Path(run.run_lock).parent.mkdir(parents=True, exist_ok=True)
            write_json(run.run_lock, new_run())
            plan = given_by_item(write_shards, fasta, tmp)(
                [fasta],
                run.shard_dir,
                config["shards"],
                config["truncation_seq_length"],
                ModelSize(spec.params, spec.embed_dim),
                store.root,
                params,
                run.checksums,
                config["long_sequences"],
                config["nucleotide_check"],
                attention_values=attention_values(spec, config),
            )
            shards = [p["shard"] for p in plan["shards"]]
            if kept:
                stack.enter_context(saying_what_is_kept(store, key, shards, plan["computed"]))
            for shard in shards:
                # No later call runs this shard: a stopped one keeps what it finished as the
                # shard's part; any pieces left (a second stop while it makes it) go (a killed
                # call leaves its open piece, which the next call or run removes).
                stack.callback(Pieces(store, key, shard).remove)
                run_shard(
                    run.shard_tsv(shard),
                    store.part(key, shard),
                    store.manifest(key, shard),
                    run.metrics(shard),
                    shard=shard,
                    settings=params,
                    toks_per_batch=config["toks_per_batch"],
                    gpus=config["gpus"],
                    batching=config["batching"],
                    compile=config["compile"],
                    keep_every=0,
                    stopped_keeps="part",
                    threads=torch.get_num_threads(),  # the caller's, left as they are
                    progress_json=run.progress(shard),
                    telemetry_tsv=run.telemetry(shard),
                    outdir=run.outdir,
                )
            merge(
                run.records,
                run.plan_json,
                store.root,
                run.embeddings,
                run.failed,
                run.run_json,
                params,
                run.checksums,
                config["output_dtype"],
                config["per_residue_compression"],
                config["contacts_dtype"],
                [run.metrics(p["shard"]) for p in plan["shards"]],
                run_lock=run.run_lock,
                output_values="copy",  # the result is read into memory, store or not
            )
        failed = read_failed(run.failed)
        return Embeddings(io.BytesIO(Path(run.embeddings).read_bytes()), failed)
