"""`esmshard export`: a run's embeddings.h5 in the layouts that other tools read, streamed in
blocks of proteins (esmshard.outputs.export.blocks).

FORMATS is the one table of them:
- `per-protein-h5`: one HDF5 dataset per protein, as biotrainer and bio_embeddings read it: one
  kind at one layer, keyed by biotrainer's sequence hash (SHA-256 of "<sequence>_<length>") with
  the record's ID in the `original_id` attribute, or by ID (`--key id`, as ProtTrans' embedder).
  Records with one sequence share its dataset under hash keys (the first record's ID is kept).
- `pt`: a folder of fair-esm extract's files, one `<name>.pt` per protein holding `label` (the
  FASTA header), `representations` (per residue), `mean_representations`,
  `bos_representations` ({layer: tensor}) and `contacts`, as far as the run included them, and
  the scores by their `include` names (`logits`, `masked_marginals`: length × 20; `pll`: 2),
  `attentions` (layers × heads × length × length).
  `<name>` is the ID with every character outside [A-Za-z0-9._-] written as %XX (UTF-8 bytes),
  so no two IDs share a name; `index.tsv` maps IDs to files (a name too long for a filesystem,
  or one that a case-insensitive filesystem confuses with another, gets a hash suffix there).
  With `--names header`, `<name>` is the full FASTA header, as extract names its files
  (`{header}.pt`, a `/` in it making subfolders), for code written for extract's outputs.
- `npy`: a folder of `<kind>_<layer>.npy` (per-protein kinds N × D; per-residue kinds every
  residue, rows of protein i at `per_tok_offsets.npy`[i:i+2]), `<kind>.npy` per unlayered kind
  with `<kind>_offsets.npy` where a protein has several rows (`contacts`: esmshard.embeddings_h5.
  contacts' triangles; `logits`, `masked_marginals`: length × 20 each), and `ids.tsv` (id, sequence_sha256):
  `numpy.load(path, mmap_mode="r")` reads any of them without loading it.
- `parquet`: a Parquet dataset, a folder of `part-NNNNN.parquet` files: one row per protein,
  `id`, `sequence_sha256`, `length` (residues embedded), and a list<float> column
  `<kind>_<layer>` per kind and layer (per-residue kinds: list<list<float>>, a row per residue),
  and a column per score (`logits`, `masked_marginals`: list<list<float>>; `pll`: list<float>);
  the card in each file's schema metadata; nothing else in the folder, which Polars reads by
  name only where it holds Parquet files alone.
- `h5`: embeddings.h5 itself with every value in the file (`output_values: copy`): the portable
  copy of a run whose values are in place in its store (esmshard.embeddings_h5.in_place).
- `biotrainer`: a folder that biotrainer trains on as is: `sequences.fasta` (each record's full
  header, so its TARGET= and SET= attributes, and its residues as embedded on one line: the
  residues biotrainer's FASTA reader keeps and hashes), `embeddings_per_protein.h5` (mean) and
  `embeddings_per_residue.h5` (per_tok), as far as the run has them, at one layer (`--layer`),
  keyed by biotrainer's hash of those lines. A per-residue file with truncated records is
  written with a warning: biotrainer's residue protocols need a row per residue.
- `h5ad`: an AnnData file (anndata, scanpy), written by h5py in AnnData's on-disk format: a
  row per protein, the IDs as `obs_names` with `length`, `truncated` and `sequence_sha256` in
  `obs`, each per-protein kind and layer in `obsm` (`mean_<layer>`, `bos_<layer>`; `pll`), no
  variables, and the card (`made_by`) in `uns["esmshard"]`. Per-residue values and maps do not
  fit a row per protein: they are left out (npy, parquet and pt hold them).

Values are copied as embeddings.h5 holds them (float32 or float16; `pt` holds float32 tensors,
as extract's, which float16 values convert to exactly).
"""

import os
import sys
from pathlib import Path
from typing import NamedTuple

from ...files import atomic_path, unwritable
from ...layout import Layout
from ...store import read_json_object
from ...store.leftovers import remove_dead_temporaries_of
from ..reader import Embeddings
from .blocks import ExportError, Options
from .h5 import write_h5
from .h5ad import write_h5ad
from .npy import write_npy
from .parquet import write_parquet
from .per_protein_h5 import BIOTRAINER_FILES, write_biotrainer, write_per_protein_h5
from .pt import write_pt
from .stop import ProgressBar


class Format(NamedTuple):
    name: str
    write: object  # (emb: Embeddings, target: Path, bar: ProgressBar, options: Options) -> None
    folder: bool  # the output is a folder of files
    options: tuple[str, ...] = ()  # the options of `export` it reads; the others are refused


FORMATS = {
    f.name: f
    for f in (
        Format("per-protein-h5", write_per_protein_h5, False, ("kind", "layer", "key")),
        Format("pt", write_pt, True, ("names",)),
        Format("npy", write_npy, True),
        Format("parquet", write_parquet, True),
        Format("h5", write_h5, False),
        Format("h5ad", write_h5ad, False),
        Format("biotrainer", write_biotrainer, True, ("layer",)),
    )
}


def option_problem(fmt: str, given: dict) -> str | None:
    """Why options given to `export` (name -> value; None: not given) do not fit `fmt`."""
    wrong = [name for name, value in given.items() if value is not None]
    wrong = [name for name in wrong if name not in FORMATS[fmt].options]
    if not wrong:
        return None
    takes = {f"--{n}": [f.name for f in FORMATS.values() if n in f.options] for n in wrong}
    return "; ".join(
        f"{option} applies to --format {' and '.join(formats)} only, not {fmt}: leave it out"
        for option, formats in takes.items()
    )


def check_target(out: Path) -> None:
    """Refuse an `--out` that exists, dangles, or lies where nothing can be written."""
    if out.is_symlink() and not out.exists():
        raise ExportError(f"{out} is a link to {os.readlink(out)}, which does not exist; "
                          "remove the link or choose another --out")  # fmt: skip
    if out.exists():
        raise ExportError(f"{out} exists; remove it or choose another --out")
    if not out.parent.is_dir():
        raise ExportError(f"{out.parent} is not a folder; make it, or choose another --out")
    problem = unwritable(out.parent)
    if problem:
        raise ExportError(f"{problem}; choose another --out")


def export(
    outdir,
    fmt: str,
    out,
    *,
    kind: str | None = None,
    layer=None,
    key=None,
    names=None,
    stream=sys.stderr,
) -> int:
    """Write the run in `outdir` as `fmt` to `out` (a new file or folder, which appears whole
    once written); returns the number of proteins. `kind` and `layer` choose per-protein-h5's
    one dataset per protein (default: mean, else the first kind held; the highest layer), `key`
    its names (default "hash"); `names` pt's file names (default "id"). An option `fmt` does not
    read is refused."""
    problem = option_problem(fmt, {"kind": kind, "layer": layer, "key": key, "names": names})
    if problem:
        raise ExportError(problem)
    layout = Layout(str(outdir))
    out = Path(out)
    check_target(out)
    if not Path(layout.embeddings).exists():
        raise ExportError(f"{layout.embeddings} does not exist: give the outdir of a finished run")
    sequences_needed = fmt == "biotrainer" or fmt == "per-protein-h5" and (key or "hash") == "hash"
    if sequences_needed and not Path(layout.records).is_file():
        needs = "biotrainer's sequences.fasta" if fmt == "biotrainer" else "--key hash"
        raise ExportError(
            f"{outdir} holds no record table of its run ({layout.records}), whose input files "
            f"give the sequences that {needs} needs (a saved esmshard.embed result has none): "
            "export from the run's outdir"
            + ("" if fmt == "biotrainer" else ", or name the proteins with --key id")
        )
    with Embeddings(layout.embeddings) as emb:
        kinds = emb.layers
        if fmt == "per-protein-h5":
            if not emb.layers:
                raise ExportError(
                    f"{layout.embeddings} holds no representations (include: contact maps or "
                    "scores only), and per-protein-h5 holds one: export as pt, npy or parquet"
                )
            chosen = kind or ("mean" if "mean" in emb.layers else next(iter(emb.layers)))
            kinds = {chosen: [emb.layer(chosen, layer)]}
        if fmt == "biotrainer":
            kinds = {k: [emb.layer(k, layer)] for k in BIOTRAINER_FILES if k in emb.layers}
            if not kinds:
                raise ExportError(
                    f"{layout.embeddings} holds neither mean nor per_tok, the representations "
                    "biotrainer trains on: run with include: [mean] or [per_tok]"
                )
        bar = ProgressBar(len(emb), f"export {fmt}", stream)
        remove_dead_temporaries_of(out)  # of an export killed before
        try:
            with atomic_path(out, replace=False) as target:
                # the run's relative input paths start where it ran (run.json's workdir)
                workdir = (read_json_object(Path(layout.run_json)) or {}).get("workdir")
                options = Options(kinds, key or "hash", layout.records, names or "id",
                                  workdir or ".")  # fmt: skip
                FORMATS[fmt].write(emb, Path(target), bar, options)
        except FileExistsError as err:
            if err.filename != str(out):
                raise
            raise ExportError(
                f"{out} appeared while this export ran (another export or program wrote it): "
                "it is left as it is, and this export is not kept; choose another --out"
            ) from None
        return len(emb)
