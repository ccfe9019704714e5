"""Streaming FASTA reading and residue normalisation."""

import bz2
import gzip
import lzma
import os
import re
import stat
import string
import zlib
from dataclasses import dataclass
from typing import Iterator, NamedTuple

import numpy as np

# ESM-2's residue tokens (fair-esm's proteinseq_toks without the gap symbols).
ALPHABET = frozenset("LAGVSERTIDPKQNFYMHWCXBUZO")

# Upper-case letters outside the alphabet and internal stops become X;
# alignment gaps and stray blanks are not residues, so they are removed.
_NORMALISE = str.maketrans(
    {
        **{c: "X" for c in string.ascii_uppercase if c not in ALPHABET},
        **{c: None for c in "-. \t"},
        "*": "X",
    }
)
_NOT_RESIDUE = re.compile(r"[^A-Z]")

# A record this long made only of these letters is a nucleotide sequence, not a protein.
NUCLEOTIDE_LETTERS = "ACGTUN"
NUCLEOTIDE_MIN_LENGTH = 20
_NUCLEOTIDE_BYTES = NUCLEOTIDE_LETTERS.encode()

# Leading bytes of compressed files: the readable ones, and the others named in the error.
READERS = {
    b"\x1f\x8b": ("gzip", gzip.open),
    b"BZh": ("bzip2", bz2.open),
    b"\xfd7zXZ\x00": ("xz", lzma.open),
}
UNREADABLE = {
    b"\x28\xb5\x2f\xfd": "zstd-compressed (decompress it with `zstd -d`)",
    b"PK\x03\x04": "a zip archive (unzip it)",
    b"7z\xbc\xaf\x27\x1c": "a 7-Zip archive (extract it)",
    b"\x04\x22\x4d\x18": "lz4-compressed (decompress it with `lz4 -d`)",
    b"\x89HDF": "an HDF5 file, not FASTA",
}
DECOMPRESSION_ERRORS = (EOFError, zlib.error, lzma.LZMAError, gzip.BadGzipFile, OSError)


class FastaError(ValueError):
    """Input that cannot be read as protein FASTA; the message names file and line."""


@dataclass
class Record:
    id: str
    header: str
    sequence: str
    source: str  # "path:line" of the header line
    n_replaced: int  # letters turned into X


def _leading_bytes(path) -> bytes:
    with open(path, "rb") as fh:
        return fh.read(8)


def compression(path) -> str | None:
    """'gzip', 'bzip2' or 'xz' for a compressed file esmshard reads, else None."""
    head = _leading_bytes(path)
    return next((name for magic, (name, _) in READERS.items() if head.startswith(magic)), None)


def open_binary(path):
    """Open plain, gzip, bzip2 or xz FASTA as a binary stream of its text."""
    head = _leading_bytes(path)
    for magic, what in UNREADABLE.items():
        if head.startswith(magic):
            raise FastaError(
                f"{path}: the file is {what}; esmshard reads plain, gzip, bzip2 and xz FASTA"
            )
    for magic, (_, opener) in READERS.items():
        if head.startswith(magic):
            return opener(path, "rb")
    return open(path, "rb")


# What a record that cannot be read is told (a list of such records says it once).
FIX_RECORD = "; fix or remove this record"


def normalise(raw: str, where: str) -> tuple[str, int]:
    """Upper-case, drop one terminal '*', map letters outside the alphabet to X."""
    if not raw.isascii():  # str.upper() would turn e.g. 'ﬀ' into 'FF'
        bad = next(c for c in raw if not c.isascii())
        raise FastaError(
            f"{where}: character {bad!r} (U+{ord(bad):04X}) is not an amino-acid letter"
            + FIX_RECORD
        )
    seq = raw.upper()
    if seq.endswith("*"):
        seq = seq[:-1]
    out = seq.translate(_NORMALISE)
    bad = _NOT_RESIDUE.search(out)
    if bad:
        raise FastaError(
            f"{where}: character {bad.group()!r} is not an amino-acid letter" + FIX_RECORD
        )
    replaced = out.count("X") - seq.count("X")
    return out, replaced


def not_a_file(path) -> str | None:
    """Why `path` cannot be read as an input file, if it cannot: it is missing, a folder, or a
    named pipe or device (the shard step reads each input twice)."""
    if not os.path.exists(path):
        return "does not exist" + (" (a link to a missing file)" if os.path.islink(path) else "")
    mode = os.stat(path).st_mode
    if stat.S_ISDIR(mode):
        return "is a folder; give the FASTA files in it (e.g. `input: [dir/a.faa, dir/b.faa]`)"
    if not stat.S_ISREG(mode):
        kind = "a named pipe (FIFO)" if stat.S_ISFIFO(mode) else "not a regular file"
        return f"is {kind}; esmshard reads each input twice, so give a file"
    return None


def looks_nucleotide(sequence: str | bytes) -> bool:
    """Made only of A, C, G, T, U and N, and long enough that a protein would not be."""
    if isinstance(sequence, str):
        sequence = sequence.encode("ascii", "replace")
    return (
        len(sequence) >= NUCLEOTIDE_MIN_LENGTH
        # the first letters settle it for nearly every protein, before the whole is looked at
        and not sequence[:NUCLEOTIDE_MIN_LENGTH].translate(None, _NUCLEOTIDE_BYTES)
        and not sequence.translate(None, _NUCLEOTIDE_BYTES)
    )


# One pass of bytes.translate does the residue rules for a whole record: letters upper-cased,
# letters outside the alphabet marked '#' (they become X), gaps, blanks and line ends deleted,
# '*' kept for the stop rule, and anything else marked '!' (worded by `normalise`).
_RESIDUE_TABLE = bytes(
    ord(c.upper())
    if c.isascii() and c.upper() in ALPHABET
    else ord("#")
    if c.isascii() and c.isalpha()
    else ord("*")
    if c == "*"
    else ord("!")
    for c in map(chr, range(256))
)
_NOT_RESIDUE_BYTES = b"-. \t\n"
# Bytes no header or sequence may hold: control characters, tab aside, and the C1 controls
# (U+0080..U+009F) in UTF-8. A NUL cannot be stored in the output's IDs; the others, shown on a
# terminal, can hide or rewrite what is around them (an escape sequence, a lone carriage return,
# which also splits lines).
_CONTROL = re.compile(rb"[\x00-\x08\x0b-\x1f\x7f]|\xc2[\x80-\x9f]")
_CONTROL_TEXT = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """`text` with its control characters written as escapes (ESC as \\x1b): for an ID from
    the outputs of an earlier esmshard, which let them in, shown on a terminal or in a TSV."""
    return _CONTROL_TEXT.sub(lambda found: found.group().encode("unicode_escape").decode(), text)


_BLOCK_BYTES = 1 << 23


class RawRecord(NamedTuple):
    """One record as the shard step streams it: the residues as ASCII bytes."""

    id: str
    header: str
    sequence: bytes
    line: int  # the header's line number
    n_replaced: int


def read_fasta(path) -> Iterator[Record]:
    """Yield the records of one FASTA file, streaming."""
    path = str(path)
    for raw in read_raw(path):
        yield Record(
            raw.id, raw.header, raw.sequence.decode("ascii"), f"{path}:{raw.line}", raw.n_replaced
        )


class FilePart(NamedTuple):
    """A byte range of a plain FASTA file that starts at a header line (`header_offsets`)."""

    start: int
    end: int
    lines_before: int  # the newlines before `start`, so that each record's line is the file's


def read_raw(path, on_bad_record=None, part: FilePart | None = None) -> Iterator[RawRecord]:
    """The records of one FASTA file (or of `part` of a plain one), streaming, read in large
    blocks (tens of MB/s per core).

    A record that cannot be read raises FastaError; with `on_bad_record`, that error is passed
    to it instead and the record skipped, so that one pass finds every bad record.
    """
    path = str(path)
    try:
        yield from _records(path, on_bad_record, part)
    except DECOMPRESSION_ERRORS as err:
        raise FastaError(
            f"{path}: cannot be read to its end ({err}); is the file truncated or corrupt?"
        ) from err


def header_offsets(path, n: int) -> list[int]:
    """Where the parts of a plain FASTA file start when it is cut into about `n` of equal size,
    each at a header line: 0, then the first header at or after each k/n of its bytes."""
    size = os.path.getsize(path)
    offsets = [0]
    with open(path, "rb") as fh:
        for k in range(1, n):
            fh.seek(max(k * size // n - 1, offsets[-1]))
            at, tail = fh.tell(), b""
            while data := fh.read(1 << 20):
                found = (tail + data).find(b"\n>")
                if found >= 0:
                    offsets.append(at - len(tail) + found + 1)
                    break
                at, tail = at + len(data), data[-1:]
            else:
                break  # no header after this point
    return sorted(set(offsets))


def count_newlines(path, start: int, end: int) -> int:
    """The line ends between two byte offsets of a file (numpy's count frees the GIL, so that
    threads count the parts of a file at once)."""
    buffer = np.empty(_BLOCK_BYTES, dtype=np.uint8)
    found = 0
    with open(path, "rb", buffering=0) as fh:
        fh.seek(start)
        while start < end:
            n = fh.readinto(memoryview(buffer)[: min(_BLOCK_BYTES, end - start)])
            if not n:
                break
            found += int(np.count_nonzero(buffer[:n] == ord("\n")))
            start += n
    return found


class _ByteRange:
    """A binary file read from one offset to another, as `_blocks` reads a file."""

    def __init__(self, path, part: FilePart):
        self.fh = open(path, "rb")
        self.fh.seek(part.start)
        self.left = part.end - part.start

    def read(self, n: int) -> bytes:
        data = self.fh.read(min(n, self.left))
        self.left -= len(data)
        return data

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.fh.close()


def _blocks(fh) -> Iterator[bytes]:
    """The file's bytes in blocks that end where a record ends, each starting with a newline.

    The newline before the first record stands for line 0, so that every header follows a
    newline; CRLF line ends are made '\\n' (a lone CR is no line end).
    """
    pending = b"\n"
    first = True
    while True:
        data = fh.read(_BLOCK_BYTES)
        if first:
            data = data.removeprefix(b"\xef\xbb\xbf")
            first = False
        if data.endswith(b"\r"):  # keep a CRLF together
            data += fh.read(1)
        # CRLF ends a line; a lone CR stays, for the record to refuse (`_record`)
        if b"\r" in data:
            data = data.replace(b"\r\n", b"\n")
        buffer = pending + data
        if not data:
            if buffer.strip():
                yield buffer
            return
        cut = buffer.rfind(b"\n>")
        if cut > 0:
            yield buffer[:cut]
            pending = buffer[cut:]
        else:
            pending = buffer


def _records(path: str, on_bad_record=None, part: FilePart | None = None) -> Iterator[RawRecord]:
    # before the current block, the one standing for line 0 excluded
    newlines = part.lines_before if part else 0
    seen_header = False
    with open_binary(path) if part is None else _ByteRange(path, part) as fh:
        for block in _blocks(fh):
            parts = block.split(b"\n>")
            if parts[0].strip():  # only the first block can start with text before a header
                before = parts[0].split(b"\n")
                blank = next(k for k, text in enumerate(before) if text.strip())
                raise FastaError(
                    f"{path}:{newlines + blank}: text before the first '>' header; "
                    "is this a FASTA file?"
                )
            newlines += parts[0].count(b"\n")
            for part in parts[1:]:
                line = newlines + 1
                newlines = line + part.count(b"\n")
                seen_header = True
                try:
                    record = _record(path, part, line)
                except FastaError as err:
                    if on_bad_record is None:
                        raise
                    on_bad_record(err)
                    continue
                yield record
    if not seen_header:
        raise FastaError(f"{path}: no FASTA records (the file is empty or has no '>' header line)")


def _record(path: str, part: bytes, line: int) -> RawRecord:
    """One record from the text after its '>': the header line, then the sequence lines."""
    end = part.find(b"\n")
    head, body = (part, b"") if end < 0 else (part[:end], part[end + 1 :])
    control = _CONTROL.search(head) or _CONTROL.search(body)
    if control:
        where = "header" if _CONTROL.search(head) else "sequence"
        byte = control.group()
        if byte == b"\r":
            what = "a carriage return (CR) inside a line; give the file LF or CRLF line ends"
        else:
            name = "a NUL byte" if byte == b"\x00" else "a control character"
            code = f"0x{byte[0]:02x}" if len(byte) == 1 else f"U+{ord(byte.decode()):04X}"
            what = f"{name} ({code}); remove it"
        raise FastaError(f"{path}:{line}: the {where} holds {what}")
    try:  # an ID is kept and looked up as text: bytes that are no UTF-8 would be replaced
        header = head.decode("utf-8").strip()
    except UnicodeDecodeError as err:
        raise FastaError(
            f"{path}:{line}: the header is not UTF-8 text (byte 0x{head[err.start]:02x} at "
            f"column {err.start + 2}); convert the file to UTF-8 (e.g. iconv -f latin1 -t utf-8)"
        ) from None
    if not header:
        raise FastaError(f"{path}:{line}: header line has no ID; give the record a name")
    sequence = body.translate(_RESIDUE_TABLE, _NOT_RESIDUE_BYTES)
    if sequence.endswith(b"*"):
        sequence = sequence[:-1]
    if b"!" in sequence:  # normalise words the error
        raw = "".join(text.strip() for text in body.decode("utf-8", "replace").split("\n"))
        normalise(raw, f"{path}:{line}")
    if not sequence:
        raise FastaError(
            f"{path}:{line}: record '{header}' has no residues; remove it or add its sequence"
        )
    replaced = sequence.count(b"#") + sequence.count(b"*")
    if replaced:
        sequence = sequence.replace(b"#", b"X").replace(b"*", b"X")
    return RawRecord(header.split()[0], header, sequence, line, replaced)
