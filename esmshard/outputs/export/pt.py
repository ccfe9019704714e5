"""Write fair-esm extract's folder of `<name>.pt` files, one per protein."""

import csv
import hashlib
import re

import numpy as np

from ...embeddings_h5 import attentions, contacts
from ...input.fasta import printable
from .blocks import ExportError, Options, blocks

SAFE = re.compile(rb"[A-Za-z0-9._-]")
MAX_NAME_BYTES = 200  # file names: most filesystems allow 255 bytes


def pt_name(id_: str) -> str:
    """A file name for `id_`, the same for no other ID: characters outside [A-Za-z0-9._-]
    (and a leading '.') written as %XX of their UTF-8 bytes; over MAX_NAME_BYTES, cut and
    completed by the SHA-256 of the ID."""
    encoded = "".join(
        chr(b) if SAFE.fullmatch(bytes([b])) and not (k == 0 and b == ord(".")) else f"%{b:02X}"
        for k, b in enumerate(id_.encode())
    )
    if len(encoded) > MAX_NAME_BYTES:
        encoded = encoded[:100] + "~" + hashlib.sha256(id_.encode()).hexdigest()
    return encoded


NAME_MAX = 255  # bytes of one file or folder name on most filesystems


def header_path(header: str) -> str:
    """fair-esm extract's file for a record, `{header}.pt` (a `/` in the header makes
    subfolders); an ExportError where the header cannot be such a path inside the export."""
    parts = f"{header}.pt".split("/")
    why = None
    if header.startswith("/") or any(p in ("", ".", "..") for p in parts):
        why = "it would lie outside the export or name no file"
    elif "\0" in header:
        why = "it holds a NUL character"
    elif any(len(p.encode()) > NAME_MAX for p in parts):
        why = f"a file name over {NAME_MAX} bytes"
    if why:
        raise ExportError(
            f"record header '{printable(header)}' cannot be a file's path ({why}); export with "
            "--names id (files named by escaped ID, index.tsv mapping IDs to files)"
        )
    return "/".join(parts)


# fair-esm extract's key for each representation kind.
PT_KEYS = {
    "per_tok": "representations",
    "mean": "mean_representations",
    "bos": "bos_representations",
}


def write_pt(emb, target, bar, options: Options):
    import torch

    target.mkdir()
    made_by = emb.made_by
    map_layers = len(emb.attention_layers) if attentions.NAME in emb.unlayered else 0
    with open(target / "index.tsv", "w", encoding="utf-8", newline="") as listing:
        # a file named by a header with a tab in it is quoted, as a TSV reader expects
        index = csv.writer(listing, delimiter="\t", lineterminator="\n")
        index.writerow(["id", "file"])
        for block in blocks(emb, options.kinds, emb.unlayered):
            for i, (id_, header) in enumerate(zip(block.ids, block.headers)):
                result = {"label": header, "esmshard": made_by}
                for kind in block.values:
                    result[PT_KEYS[kind]] = {
                        layer: torch.from_numpy(np.array(row, dtype=np.float32))
                        for layer, row in block.rows(kind, i).items()
                    }
                for kind in block.unlayered:
                    values = block.scores(kind, i)
                    if kind == contacts.NAME:
                        values = contacts.full_matrix(values, int(block.lengths[i]))
                    elif kind == attentions.NAME:  # layers × heads × L × L
                        values = attentions.maps(values, int(block.lengths[i]), map_layers)
                    result[kind] = torch.from_numpy(np.array(values, dtype=np.float32))
                if options.names == "header":
                    file = header_path(header)
                    (target / file).parent.mkdir(parents=True, exist_ok=True)
                    try:
                        fh = open(target / file, "xb")
                    except FileExistsError:  # headers equal but for case, on such a filesystem
                        raise ExportError(
                            f"record '{printable(id_)}': {file} is an earlier record's file too; "
                            "export with --names id"
                        ) from None
                else:
                    file = f"{pt_name(id_)}.pt"
                    try:
                        fh = open(target / file, "xb")
                    except FileExistsError:  # a case-insensitive filesystem
                        file = f"{pt_name(id_)}~{hashlib.sha256(id_.encode()).hexdigest()}.pt"
                        fh = open(target / file, "xb")
                with fh:
                    torch.save(result, fh)
                index.writerow([printable(id_), file])
            bar.update(len(block.ids))
