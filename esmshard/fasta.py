"""Streaming FASTA reading and residue normalisation."""
import gzip
import re
import string
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


class FastaError(ValueError):
    """Input that cannot be read as protein FASTA; the message names file and line."""


@dataclass
class Record:
    id: str
    header: str
    sequence: str
    source: str  # "path:line" of the header line
    n_replaced: int  # letters turned into X


def open_text(path):
    """Open plain or gzip-compressed text; universal newlines handle CRLF files."""
    with open(path, "rb") as fh:
        gzipped = fh.read(2) == b"\x1f\x8b"
    if gzipped:
        return gzip.open(path, "rt", encoding="utf-8", errors="replace")
    return open(path, "rt", encoding="utf-8", errors="replace")


def normalise(raw: str, where: str) -> tuple[str, int]:
    """Upper-case, drop one terminal '*', map letters outside the alphabet to X."""
    seq = raw.upper()
    if seq.endswith("*"):
        seq = seq[:-1]
    out = seq.translate(_NORMALISE)
    bad = _NOT_RESIDUE.search(out)
    if bad:
        raise FastaError(
            f"{where}: character {bad.group()!r} is not an amino-acid letter; "
            "fix or remove this record"
        )
    replaced = out.count("X") - seq.count("X")
    return out, replaced


def read_fasta(path) -> Iterator[Record]:
    """Yield the records of one FASTA file, streaming."""
    path = str(path)
    header, header_line, chunks = None, 0, []

    def finish():
        where = f"{path}:{header_line}"
        raw = "".join(chunks)
        sequence, replaced = normalise(raw, where)
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
                    raise FastaError(f"{path}:{lineno}: header line has no ID; give the record a name")
            elif line:
                if header is None:
                    raise FastaError(
                        f"{path}:{lineno}: text before the first '>' header; "
                        "is this a FASTA file?"
                    )
                chunks.append(line)
    if header is None:
        raise FastaError(f"{path}: no FASTA records (the file is empty or has no '>' header line)")
    yield finish()
