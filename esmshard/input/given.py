"""Write the sequences given to `esmshard.embed` (a path, text, a mapping, pairs or a table) as
a FASTA file, checking each ID and sequence first."""

import logging
import numbers
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

from .fasta import FIX_RECORD, FastaError, looks_nucleotide, normalise, not_a_file, printable

Sequences = Mapping[str, str] | Iterable[tuple[str, str]] | Iterable[str] | str | os.PathLike
# A string that names no file and is made of these is one sequence, not a path.
SEQUENCE_TEXT = re.compile(r"[A-Za-z*\s-]+")
# What a path has and a sequence has not: a folder, or an extension.
PATH_LIKE = re.compile(r"[/\\]|\.[A-Za-z0-9]+$|^~")
# A table's columns of IDs and of sequences (pairs_of), by the names people give them.
TABLE_COLUMNS = (("id", "name"), ("sequence", "seq"))


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
