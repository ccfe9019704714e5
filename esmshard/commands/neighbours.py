"""`esmshard neighbours`: each query's k nearest proteins in a reference embedded earlier (an
outdir or an embeddings.h5 of the same model), with the neighbours' annotations and, per query,
the nearest annotated neighbour's annotation and its reliability index (esmshard.search).
"""

import os
import sys
from pathlib import Path
from typing import NamedTuple

import numpy as np

from ..files import DamagedFileError, is_object_url
from ..outputs import nearest as found
from ..outputs.nearest_terms import Carry, carried_terms, carry_asked
from ..outputs.per_protein import open_reference, unrecorded_line
from ..outputs.reader import Embeddings, embeddings_file
from ..search import METRICS, Hits
from ..search.annotations import unmatched_line
from ..search.approximate import KINDS, faiss_missing
from ..search.ontology import ontology_problem
from ..search.transfer import TIES_SEARCHED, write_transfer

# what to give instead of a file that is not an esmshard run's embeddings
GIVE = "give an esmshard run's outdir or its embeddings.h5"


def add_neighbours_command(commands) -> None:
    """Add `esmshard neighbours`."""
    command = commands.add_parser(
        "neighbours",
        help="find each query's k nearest proteins in a reference, and carry annotations over",
        description="Write each query's K nearest proteins of REFERENCE (exact search of the "
        "mean embeddings), nearest first: id, rank, neighbour, distance, and the neighbour's "
        "annotation columns. QUERIES and REFERENCE are outdirs or embeddings.h5 files of the "
        "same model; the same file for both searches it against itself, each protein's own row "
        "left out. REFERENCE may also be a per-protein HDF5 (one dataset per protein: "
        "UniProt's, EAT's, esmshard export's per-protein-h5) of the same model and width.",
    )
    command.add_argument("queries", help="the queries' outdir or embeddings.h5")
    command.add_argument(
        "--reference", required=True,
        help="the reference's outdir or embeddings.h5, or a per-protein HDF5",
    )  # fmt: skip
    command.add_argument("-k", type=int, default=10, help="neighbours per query (default 10)")
    command.add_argument("--metric", choices=METRICS, default="euclidean")
    command.add_argument("--layer", type=int, help="the mean layer (default: the last held)")
    command.add_argument(
        "-o", "--out", required=True, type=Path,
        help="the table to write: TSV, or Parquet (naming model, layer, metric, reference and k) "
        "where the name ends in .parquet",
    )  # fmt: skip
    command.add_argument(
        "--annotations",
        type=Path,
        help="a CSV or TSV with an `id` column and the reference's columns to carry over (a row "
        "per ID, or several: their values joined by ;); the nearest annotated neighbour of each "
        "query, its distance and reliability index are then written to --transferred",
    )
    command.add_argument(
        "--transferred",
        type=Path,
        help="with --annotations, the per-query TSV (default: beside --out, NAME.annotations.tsv)",
    )
    command.add_argument(
        "--terms",
        metavar="COLUMN",
        help="with --annotations, carry every term of COLUMN (GO terms: values separated by ; or "
        ",) of the K nearest as goPredSim does: per query and term, the sum of the reliability "
        "indices of the hits that carry it over the hits counted (those tied at the K-th "
        "distance too), rounded to 0.01; written to --terms-out",
    )
    command.add_argument(
        "--max-distance",
        type=float,
        help="with --terms, count every hit within this distance (of the K searched) instead",
    )
    command.add_argument(
        "--ontology",
        type=Path,
        metavar="OBO",
        help="with --terms, a GO release (go-basic.obo): each aspect (BPO, MFO, CCO) searched "
        "among the references annotated in it, and only each query's most specific terms kept, "
        "as goPredSim does",
    )
    command.add_argument(
        "--index",
        choices=KINDS,
        default="exact",
        help="exact (default), or a faiss index of REFERENCE (ivf, hnsw; needs faiss-cpu) "
        "built once and kept beside it in neighbours_index/, read again while its vectors stay "
        "the same; its recall@K against the exact search is measured on a sample of the "
        "queries and said; auto: ivf from 100,000 reference proteins and 2,000 queries, else "
        "exact",
    )
    command.add_argument(
        "--terms-out",
        type=Path,
        help="with --terms, the TSV of id, term, aspect, reliability, hits (default: beside "
        "--out, NAME.terms.tsv)",
    )


def say(line: str) -> None:
    print(f"esmshard neighbours: {line}", file=sys.stderr)


def neighbours(parser, args) -> int:
    """Search, then write the neighbours and (with annotations) what they carry over."""
    if args.k < 1:
        parser.exit(2, "esmshard neighbours: -k must be 1 or more\n")
    if (args.terms or args.max_distance is not None) and not args.annotations:
        parser.exit(2, "esmshard neighbours: --terms and --max-distance need --annotations\n")
    if args.ontology and not args.terms:
        parser.exit(2, "esmshard neighbours: --ontology needs --terms (the column of GO terms)\n")
    if args.ontology and (problem := ontology_problem(args.ontology)):
        parser.exit(2, f"esmshard neighbours: --ontology {problem}\n")
    if missing := faiss_missing(args.index):
        parser.exit(2, f"esmshard neighbours: --index {args.index} {missing} (or use --index "
                    "exact)\n")  # fmt: skip
    where = args.transferred or args.out.with_suffix(".annotations.tsv")
    outputs = {"-o": args.out, **({"--transferred": where} if args.annotations else {})}
    if args.terms:
        outputs["--terms-out"] = args.terms_out or args.out.with_suffix(".terms.tsv")
    problem = path_problem(args, outputs)
    if problem:
        parser.exit(2, f"esmshard neighbours: {problem}\n")
    try:
        with Embeddings(args.queries) as queries, open_reference(args.reference) as reference:
            carry = carry_asked(args.annotations, args.terms, args.max_distance, args.ontology,
                                args.k)  # fmt: skip
            if carry.unknown:
                say(carry.unknown)
            searched = search(queries, reference, args, carry)
            query_ids = queries.ids()
            model = queries.made_by.get("model")
    except DamagedFileError as err:
        parser.exit(1, f"esmshard neighbours: {err.problem}: {GIVE}\n")
    except OSError as err:
        parser.exit(1, f"esmshard neighbours: {err.filename}: {err.strerror}\n")
    except (KeyError, ValueError) as err:
        parser.exit(1, f"esmshard neighbours: {err.args[0] if err.args else err}\n")
    parquet = args.out.suffix == ".parquet"
    tables = found.Tables(
        None if parquet else str(args.out),
        parquet=str(args.out) if parquet else None,
        transferred=str(where) if args.annotations else None,
    )
    card = {"model": model, "layer": searched.layer, "metric": args.metric,
            "reference": args.reference, "k": args.k}  # fmt: skip
    hits, ids = searched.hits, searched.ids
    nearest_k = Hits(hits.rows[:, : args.k], hits.distances[:, : args.k])
    found.write_tables(tables, nearest_k, query_ids, ids, carry.annotations, args.metric, card)
    if carry.transfer is not None:
        write_terms(outputs["--terms-out"], carry, searched, query_ids, args)
    if args.annotations:
        unmatched = unmatched_line(carry.annotations, ids, args.annotations, args.reference)
        if unmatched:
            say(unmatched)
        say(f"wrote {args.out} and {where}")
    else:
        say(f"wrote {args.out}")
    return 0


def path_problem(args, outputs: dict[str, Path]) -> str | None:
    """Why the paths cannot be searched or written, before anything is read: an input absent
    or in object storage, an output that names an input or another output, or whose folder is
    absent."""
    inputs = {"QUERIES": args.queries, "--reference": args.reference}
    for name, path in inputs.items():
        if is_object_url(path):
            return (
                f"{name} {path} is in object storage: esmshard neighbours reads files; copy its "
                "embeddings.h5 here first"
            )
        if not os.path.exists(path):
            return f"{name} {path} does not exist: {GIVE}"
    read = {name: embeddings_file(path) for name, path in inputs.items()}
    if args.annotations:
        read["--annotations"] = args.annotations
    seen = {}
    for name, path in outputs.items():
        same = next((n for n, p in {**read, **seen}.items() if same_file(p, path)), None)
        if same:
            return f"{name} {path} is also {same}'s file: choose another path for {name}"
        if not path.parent.is_dir():
            return f"{name} {path}: the folder {path.parent} does not exist: create it first"
        seen[name] = path
    return None


def same_file(a: Path, b: Path) -> bool:
    return Path(a).resolve() == Path(b).resolve()


class Searched(NamedTuple):
    """The hits of every query, the reference's IDs, the layer compared, and with an ontology
    each aspect's own hits (among the references annotated in it)."""

    hits: Hits
    ids: list
    layer: int
    aspects: dict


def write_terms(path: Path, carry: Carry, searched: Searched, query_ids, args) -> None:
    """The terms carried to each query, goPredSim's way (esmshard.search.transfer)."""
    rows = carried_terms(carry, searched.hits, searched.aspects, query_ids, searched.ids,
                         args.metric)  # fmt: skip
    write_transfer(str(path), None, rows, {})
    say(f"carried {len(rows):,} terms of {args.terms} to {len({r.id for r in rows}):,} of "
        f"{len(query_ids):,} queries: {path}")  # fmt: skip


def search(queries: Embeddings, reference: Embeddings, args, carry: Carry) -> Searched:
    """The hits of every query (and of each aspect, where terms are carried per aspect); the k
    past the reference, and the queries whose embeddings are not numbers, said."""
    layer = found.comparable_layer(queries, reference, args.layer)
    if unrecorded_line(reference):
        say(unrecorded_line(reference))
    itself = Path(queries.name).resolve() == Path(reference.name).resolve()
    available = len(reference) - (1 if itself else 0)
    if args.k > available:
        say(
            f"-k {args.k} asks for more than {reference.name} holds: each query gets "
            f"{available} neighbour{'s' if available != 1 else ''}"
        )
    vectors = np.asarray(queries.array("mean", layer), dtype=np.float32)
    not_numbers = found.not_numbers_line(vectors, queries)
    if not_numbers:
        say(not_numbers)
    own = np.arange(len(queries)) if itself else None
    # goPredSim's transfer counts the hits tied at the k-th distance too: a few more searched
    k = min(args.k + (TIES_SEARCHED if args.terms else 0), max(available, 1))
    ids, every = reference.ids(), (0, len(reference))

    def hits_of(subset="", allowed=None) -> Hits:
        # torch's top k on the CPU: about 2.5 times numpy's partition (esmshard.steps.neighbours)
        asked = found.index_asked(args.index, reference, every, subset)
        done = found.searched_by(asked, vectors, reference, layer, k, args.metric, own,
                                 device="cpu", allowed=allowed)  # fmt: skip
        if done.index is not None and not subset:
            say(f"searched by {done.index.line()}")
        return done.hits

    hits = hits_of()
    aspects = {aspect: hits_of(aspect, allowed)
               for aspect, allowed in carry.aspect_rows(ids).items()}  # fmt: skip
    return Searched(hits, ids, layer, aspects)
