"""esmshard's Python API: `embed` computes embeddings in this process (esmshard.api.in_process),
`open_embeddings` reads a run's. Each imports what it needs when called, so that `import
esmshard` stays quick (every workflow job imports it)."""

import importlib
import os
import signal
import threading
from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..input.given import Sequences
    from ..outputs.reader import Embeddings


def open_embeddings(path) -> "Embeddings":
    """Open a run's embeddings.h5 (or the outdir that holds it) for reading: esmshard.outputs.reader."""
    return imported_whole("esmshard.outputs.reader").Embeddings(path)


def embed(
    sequences: "Sequences",
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
) -> "Embeddings":
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
    per_residue_compression, output_values (but "in_place", for runs): as the workflow's config
    keys (docs/configuration.md); the result holds its values in memory. A call stopped midway
    (Ctrl-C, an error) with a `store` keeps there what it finished: the same call again
    computes only the rest.

    The result's `failed` maps each sequence that could not be embedded to the reason. Bad
    input raises ValueError (esmshard.input.fasta.FastaError for a file), naming the item by its
    ID or place; a model that cannot be had esmshard.models.ModelError; settings that do not
    fit ConfigError, naming each setting.
    """
    # The keywords are config keys: taken as one mapping, checked as a run's config is.
    settings = {key: value for key, value in locals().items() if key != "sequences"}
    in_process = imported_whole("esmshard.api.in_process", "torch")
    return in_process.embed_in_process(sequences, settings)


def imported_whole(*modules: str):
    """Import `modules` and return the first, a Ctrl-C meanwhile landing once they are whole: a
    module cut short midway (numpy's, torch's) cannot be imported again in the process, and
    every later call would fail on it."""
    handler = signal.getsignal(signal.SIGINT)
    main = threading.current_thread() is threading.main_thread()
    if handler is None or not main:  # a handler set outside Python, or no signals here
        return [importlib.import_module(name) for name in modules][0]
    arrived = []
    signal.signal(signal.SIGINT, lambda *_: arrived.append(True))
    try:
        loaded = [importlib.import_module(name) for name in modules][0]
    finally:
        signal.signal(signal.SIGINT, handler)
    if arrived:
        signal.raise_signal(signal.SIGINT)  # to the caller's handler: KeyboardInterrupt
    return loaded
