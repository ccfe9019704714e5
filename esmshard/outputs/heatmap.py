"""A protein's substitution scores as a picture (`esmshard heatmap OUTDIR ID -o FILE`), as the
esm-variants portal shows them: each position's log p(amino acid) − log p(wild type), the 20
amino acids in the portal's order (charged, polar, small, hydrophobic, aromatic), a diverging
colour scale centred on 0 and the wild type's cell black. A long protein is drawn in rows of
at most POSITIONS_PER_ROW positions, as many in each, numbered as the run numbered its
residues (`variant_offset`), so that a residue of a 5,000-residue protein can be found by eye;
the colour scale once, above the rows.
"""

import hashlib
import os
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ..embeddings_h5.scores import AMINO_ACIDS, LOGITS, MASKED_MARGINALS, residue_columns
from ..files import atomic_path
from ..input.fasta import printable, read_raw
from ..layout import Layout
from ..store import read_json_object
from .reader import Embeddings

PORTAL_ORDER = "KRHEDNQTSCGAVLIMPYFW"  # esm-variants' AAorder
POSITIONS_PER_ROW = 250
ROW_INCHES = 3.0  # each row's height: 20 amino acids, 15 pixels each at 100 dpi
HEADER_INCHES = 1.1  # the title and the colour scale
LABEL_POINTS = 9  # an amino acid's letter: 12.5 pixels, within its row's 15
FORMATS = (".png", ".svg")
SCORES = (LOGITS, MASKED_MARGINALS)  # each strategy's log-probabilities


class Drawn(NamedTuple):
    """A picture written: where, and how its positions lie."""

    path: Path
    length: int  # positions
    first: int  # the first one's number

    @property
    def line(self) -> str:
        width = per_row(self.length)
        rows = -(-self.length // width)
        return (
            f"wrote {self.path}: positions {self.first:,} to {self.first + self.length - 1:,} "
            f"in {rows} row{'s' if rows > 1 else ''} of up to {width}"
        )


class HeatmapError(ValueError):
    """Why the picture cannot be drawn, in one line."""


def record_sequence(layout: Layout, id_: str, sha256: bytes) -> str:
    """The record `id_`'s residues, read again from the run's input file (records.parquet
    names it, relative to where the run ran) and checked against the sequence embedded."""
    table = pq.read_table(layout.records, columns=["id", "file"], filters=[("id", "=", id_)])
    if not table.num_rows:
        raise HeatmapError(f"{layout.records} lists no record '{printable(id_)}'")
    workdir = (read_json_object(Path(layout.run_json)) or {}).get("workdir") or "."
    path = os.path.join(workdir, str(pc.unique(table.column("file"))[0]))
    if not Path(path).is_file():
        raise HeatmapError(
            f"the wild type of '{printable(id_)}' is read from the run's input {path}, which is "
            "not there (moved or removed since the run); put it back"
        )
    for record in read_raw(path):
        if record.id == id_:
            if hashlib.sha256(record.sequence).hexdigest().encode() != sha256:
                raise HeatmapError(
                    f"record '{printable(id_)}' of {path} has another sequence than the one "
                    "embedded: the input changed since the run; run the workflow again"
                )
            return record.sequence.decode("ascii")
    raise HeatmapError(f"{path} holds no record '{printable(id_)}' any more; run again")


def substitution_scores(matrix: np.ndarray, sequence: str) -> np.ndarray:
    """positions × 20 (AMINO_ACIDS' order): log p(a) − log p(wild type); NaN at positions
    whose residue is none of the 20."""
    wild = residue_columns(sequence)
    own = matrix[np.arange(len(sequence)), np.maximum(wild, 0)]
    return np.where(wild[:, None] >= 0, matrix - own[:, None], np.nan)


def per_row(length: int) -> int:
    """The positions in each row: as many in each, at most POSITIONS_PER_ROW."""
    rows = -(-length // POSITIONS_PER_ROW)
    return -(-length // rows)


def draw(scores: np.ndarray, sequence: str, title: str, out, fmt: str, first: int = 1) -> None:
    """The picture of `scores` (positions × 20, the first numbered `first`) into `out`, as
    `fmt` (png or svg)."""
    from matplotlib.colors import ListedColormap, Normalize
    from matplotlib.figure import Figure  # not pyplot: no GUI backend, no global figures

    order = [AMINO_ACIDS.index(a) for a in PORTAL_ORDER]
    grid = scores[:, order].T  # 20 × positions, the portal's order top to bottom
    extreme = float(np.nanmax(np.abs(grid))) if np.isfinite(grid).any() else 1.0
    norm = Normalize(-(extreme or 1.0), extreme or 1.0)
    wild = np.array([[a == letter for letter in sequence] for a in PORTAL_ORDER])
    width = per_row(len(sequence))
    rows = -(-len(sequence) // width)
    figure = Figure(figsize=(15, HEADER_INCHES + ROW_INCHES * rows), layout="constrained")
    header, body = figure.subfigures(2, 1, height_ratios=[HEADER_INCHES, ROW_INCHES * rows])
    axes = body.subplots(rows, 1, squeeze=False)[:, 0]
    for k, ax in enumerate(axes):
        part = slice(k * width, min((k + 1) * width, len(sequence)))
        low = first + part.start - 0.5
        extent = (low, first + part.stop - 0.5, 19.5, -0.5)
        image = ax.imshow(grid[:, part], cmap="RdBu", norm=norm, aspect="auto",
                          extent=extent, interpolation="nearest")  # fmt: skip
        marked = np.ma.masked_where(~wild[:, part], np.ones(wild[:, part].shape))
        ax.imshow(marked, cmap=ListedColormap(["black"]), aspect="auto", extent=extent,
                  interpolation="nearest")  # fmt: skip
        ax.set_xlim(low, low + width)
        ax.set_yticks(range(20), list(PORTAL_ORDER), fontsize=LABEL_POINTS)
        ax.tick_params(axis="x", labelsize=LABEL_POINTS)
    axes[-1].set_xlabel("position", fontsize=LABEL_POINTS + 1)
    header.suptitle(title, fontsize=11, x=0.01, ha="left")
    scale = header.subplots(1, 3, width_ratios=[1, 2, 1])
    for ax in scale[::2]:
        ax.axis("off")
    header.colorbar(image, cax=scale[1], orientation="horizontal")
    scale[1].set_xlabel("log p(amino acid) − log p(wild type)", fontsize=LABEL_POINTS + 1)
    figure.savefig(out, format=fmt, dpi=100)


def heatmap(outdir, id_: str, out, scores: str | None = None) -> Drawn:
    """Draw protein `id_`'s substitution scores of the run in `outdir` into `out` (.png or
    .svg); `scores`: `logits` (wt_marginals, the portal's) or `masked_marginals`, by default
    the first of them the run has."""
    out = Path(out)
    if out.suffix.lower() not in FORMATS:
        raise HeatmapError(f"{out}: give a file name ending .png or .svg")
    if not out.parent.is_dir():
        raise HeatmapError(f"{out.parent} is not a folder; make it, or choose another -o")
    layout = Layout(str(outdir))
    if not Path(layout.embeddings).exists():
        raise HeatmapError(
            f"{layout.embeddings} does not exist: give the outdir of a finished run"
        )
    with Embeddings(layout.embeddings) as emb:
        held = [kind for kind in SCORES if kind in emb.unlayered]
        if scores is not None and scores not in held or not held:
            wanted = scores or "logits or masked_marginals"
            raise HeatmapError(
                f"{layout.embeddings} holds no {wanted} (it holds "
                f"{', '.join(held) or 'no scores'}); run with include: [{scores or 'logits'}], "
                "or variants"
            )
        kind = scores or held[0]
        try:
            row = emb.row(id_)
        except KeyError:
            raise HeatmapError(no_protein(emb, layout.embeddings, id_)) from None
        matrix = np.asarray(emb.values(row, kind), dtype=np.float64)
        sha256 = emb.h5["sequence_sha256"][row]
    sequence = record_sequence(layout, id_, sha256)[: len(matrix)]
    strategy = "wt_marginals" if kind == LOGITS else kind
    title = f"{id_}: {len(sequence):,} residues, {strategy} (the wild type black)"
    first = variant_offset(layout)
    if first != 1:
        title += f", numbered from {first} (variant_offset)"
    with atomic_path(out) as target:  # whole, or not at all
        fmt = out.suffix[1:].lower()
        draw(substitution_scores(matrix, sequence), sequence, title, target, fmt, first)
    return Drawn(out, len(sequence), first)


def variant_offset(layout: Layout) -> int:
    """The number the run gave its first residue (`variant_offset`, in its variants' summary),
    else 1."""
    summary = read_json_object(Path(layout.variant_summary)) or {}
    offset = summary.get("made_by", {}).get("variant_offset", 1)
    return offset if isinstance(offset, int) else 1


def no_protein(emb: Embeddings, path, id_: str, block: int = 1 << 16) -> str:
    """The line for an ID the file lacks, naming the IDs that hold it (UniProt's
    `sp|P0DTD1|R1AB_SARS2` for `R1AB_SARS2` or `P0DTD1`), read a block of IDs at a time."""
    wanted, found = id_.lower(), []
    for start in range(0, len(emb), block):
        found += [name for name in emb.ids(start, start + block) if wanted in name.lower()]
        if len(found) > 3:
            break
    line = f"{path} holds no protein '{printable(id_)}' (failed, or not in the input)"
    if found:
        shown = ", ".join(printable(name) for name in found[:3])
        line += f"; did you mean {shown}{', ...' if len(found) > 3 else ''}?"
    return line
