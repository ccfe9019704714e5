"""A protein's substitution scores as a picture (`esmshard heatmap OUTDIR ID -o FILE`), as the
esm-variants portal shows them: each position's log p(amino acid) − log p(wild type), the 20
amino acids in the portal's order (charged, polar, small, hydrophobic, aromatic), a diverging
colour scale centred on 0 and the wild type's cell black. A long protein is drawn in rows of
POSITIONS_PER_ROW positions, each numbered, so that a residue of a 5,000-residue protein can be
found by eye.
"""

import hashlib
import os
from pathlib import Path

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
ROW_INCHES = 2.2  # each row's height: 20 amino acids, their letters legible at 100 dpi
FORMATS = (".png", ".svg")
SCORES = (LOGITS, MASKED_MARGINALS)  # each strategy's log-probabilities


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


def draw(scores: np.ndarray, sequence: str, title: str, out, fmt: str) -> None:
    """The picture of `scores` (positions × 20) into `out`, as `fmt` (png or svg)."""
    from matplotlib.colors import ListedColormap, Normalize
    from matplotlib.figure import Figure  # not pyplot: no GUI backend, no global figures

    order = [AMINO_ACIDS.index(a) for a in PORTAL_ORDER]
    grid = scores[:, order].T  # 20 × positions, the portal's order top to bottom
    extreme = float(np.nanmax(np.abs(grid))) if np.isfinite(grid).any() else 1.0
    norm = Normalize(-(extreme or 1.0), extreme or 1.0)
    wild = np.array([[a == letter for letter in sequence] for a in PORTAL_ORDER])
    rows = -(-len(sequence) // POSITIONS_PER_ROW)
    figure = Figure(figsize=(15, ROW_INCHES * rows + 0.6), layout="constrained")
    axes = figure.subplots(rows, 1, squeeze=False)
    for k, ax in enumerate(axes[:, 0]):
        start = k * POSITIONS_PER_ROW
        part = slice(start, min(start + POSITIONS_PER_ROW, len(sequence)))
        extent = (part.start + 0.5, part.stop + 0.5, 19.5, -0.5)  # positions from 1
        image = ax.imshow(grid[:, part], cmap="RdBu", norm=norm, aspect="auto",
                          extent=extent, interpolation="nearest")  # fmt: skip
        marked = np.ma.masked_where(~wild[:, part], np.ones(wild[:, part].shape))
        ax.imshow(marked, cmap=ListedColormap(["black"]), aspect="auto", extent=extent,
                  interpolation="nearest")  # fmt: skip
        ax.set_xlim(start + 0.5, start + POSITIONS_PER_ROW + 0.5)
        ax.set_yticks(range(20), list(PORTAL_ORDER), fontsize=7)
        ax.tick_params(axis="x", labelsize=7)
    axes[0, 0].set_title(title, fontsize=10, loc="left")
    figure.colorbar(image, ax=axes[:, 0].tolist(), fraction=0.02, pad=0.01,
                    label="log p(amino acid) − log p(wild type)")  # fmt: skip
    figure.savefig(out, format=fmt, dpi=100)


def heatmap(outdir, id_: str, out, scores: str | None = None) -> Path:
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
            raise HeatmapError(
                f"{layout.embeddings} holds no protein '{printable(id_)}' (failed, or not in the "
                "input)"
            ) from None
        matrix = np.asarray(emb.values(row, kind), dtype=np.float64)
        sha256 = emb.h5["sequence_sha256"][row]
    sequence = record_sequence(layout, id_, sha256)[: len(matrix)]
    strategy = "wt_marginals" if kind == LOGITS else kind
    title = f"{id_}: {len(sequence):,} residues, {strategy} (the wild type black)"
    with atomic_path(out) as target:  # whole, or not at all
        fmt = out.suffix[1:].lower()
        draw(substitution_scores(matrix, sequence), sequence, title, target, fmt)
    return out
