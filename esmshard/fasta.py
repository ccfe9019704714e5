"""Streaming FASTA reading and residue normalisation."""

import bz2
import gzip
import io
import lzma
import re
import string
import zlib
from dataclasses import dataclass
from typing import Iterator

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
_DROP_NUCLEOTIDES = str.maketrans("", "", NUCLEOTIDE_LETTERS)

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


def open_text(path):
    """Open plain, gzip, bzip2 or xz text; universal newlines handle CRLF, a UTF-8 BOM is dropped."""
    head = _leading_bytes(path)
    for magic, what in UNREADABLE.items():
        if head.startswith(magic):
            raise FastaError(
                f"{path}: the file is {what}; esmshard reads plain, gzip, bzip2 and xz FASTA"
            )
    for magic, (_, opener) in READERS.items():
        if head.startswith(magic):
            return io.TextIOWrapper(opener(path, "rb"), encoding="utf-8-sig", errors="replace")
    return open(path, "rt", encoding="utf-8-sig", errors="replace")


def normalise(raw: str, where: str) -> tuple[str, int]:
    """Upper-case, drop one terminal '*', map letters outside the alphabet to X."""
    if not raw.isascii():  # str.upper() would turn e.g. 'ﬀ' into 'FF'
        bad = next(c for c in raw if not c.isascii())
        raise FastaError(
            f"{where}: character {bad!r} (U+{ord(bad):04X}) is not an amino-acid letter; "
            "fix or remove this record"
        )
    seq = raw.upper()
    if seq.endswith("*"):
        seq = seq[:-1]
    out = seq.translate(_NORMALISE)
    bad = _NOT_RESIDUE.search(out)
    if bad:
        raise FastaError(
            f"{where}: character {bad.group()!r} is not an amino-acid letter; fix or remove this record"
        )
    replaced = out.count("X") - seq.count("X")
    return out, replaced


def looks_nucleotide(sequence: str) -> bool:
    """Made only of A, C, G, T, U and N, and long enough that a protein would not be."""
    return len(sequence) >= NUCLEOTIDE_MIN_LENGTH and not sequence.translate(_DROP_NUCLEOTIDES)


def read_fasta(path) -> Iterator[Record]:
    """Yield the records of one FASTA file, streaming."""
    path = str(path)
    try:
        yield from _records(path)
    except DECOMPRESSION_ERRORS as err:
        raise FastaError(
            f"{path}: cannot be read to its end ({err}); is the file truncated or corrupt?"
        ) from err


def _records(path: str) -> Iterator[Record]:
    header, header_line, chunks = None, 0, []

    def finish():
        where = f"{path}:{header_line}"
        sequence, replaced = normalise("".join(chunks), where)
        if not sequence:
            raise FastaError(
                f"{where}: record '{header}' has no residues; remove it or add its sequence"
            )
        return Record(header.split()[0], header, sequence, where, replaced)

    with open_text(path) as fh:
        for lineno, line in enumerate(fh, 1):
            line = line.strip()
            if line.startswith(">"):
                if header is not None:
                    yield finish()
                header, header_line, chunks = line[1:].strip(), lineno, []
                if not header:
                    raise FastaError(
                        f"{path}:{lineno}: header line has no ID; give the record a name"
                    )
            elif line:
                if header is None:
                    raise FastaError(
                        f"{path}:{lineno}: text before the first '>' header; is this a FASTA file?"
                    )
                chunks.append(line)
    if header is None:
        raise FastaError(f"{path}: no FASTA records (the file is empty or has no '>' header line)")
    yield finish()
