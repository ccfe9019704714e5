"""`esmshard neighbours`: each query's k nearest proteins in a reference embedded earlier (an
outdir or an embeddings.h5 of the same model), with the neighbours' annotations and, per query,
the nearest annotated neighbour's annotation and its reliability index (esmshard.search).
"""

import sys
from pathlib import Path

import numpy as np

from ..outputs import nearest as found
from ..outputs.reader import Embeddings
from ..search import METRICS


def add_neighbours_command(commands) -> None:
    """Add `esmshard neighbours`."""
    command = commands.add_parser(
        "neighbours",
        help="find each query's k nearest proteins in a reference, and carry annotations over",
        description="Write each query's K nearest proteins of REFERENCE (exact search of the "
        "mean embeddings), nearest first: id, rank, neighbour, distance, and the neighbour's "
        "annotation columns. QUERIES and REFERENCE are outdirs or embeddings.h5 files of the "
        "same model; the same file for both searches it against itself, each protein's own row "
        "left out.",
    )
    command.add_argument("queries", type=Path, help="the queries' outdir or embeddings.h5")
    command.add_argument("--reference", required=True, type=Path, help="the reference's")
    command.add_argument("-k", type=int, default=10, help="neighbours per query (default 10)")
    command.add_argument("--metric", choices=METRICS, default="euclidean")
    command.add_argument("--layer", type=int, help="the mean layer (default: the last held)")
    command.add_argument("-o", "--out", required=True, type=Path, help="the TSV to write")
    command.add_argument(
        "--annotations",
        type=Path,
        help="a CSV or TSV with an `id` column and the reference's columns to carry over; the "
        "nearest annotated neighbour of each query, its distance and reliability index are "
        "then written to --transferred",
    )
    command.add_argument(
        "--transferred",
        type=Path,
        help="with --annotations, the per-query TSV (default: beside --out, NAME.annotations.tsv)",
    )


def say(line: str) -> None:
    print(f"esmshard neighbours: {line}", file=sys.stderr)


def neighbours(parser, args) -> int:
    """Search, then write the neighbours and (with annotations) what they carry over."""
    if args.k < 1:
        parser.exit(2, "esmshard neighbours: -k must be 1 or more\n")
    try:
        with Embeddings(args.queries) as queries, Embeddings(args.reference) as reference:
            annotations = found.read_annotations(args.annotations) if args.annotations else {}
            hits, ids = search(queries, reference, args)
            query_ids = queries.ids()
    except (OSError, KeyError, ValueError) as err:
        parser.exit(1, f"esmshard neighbours: {err.args[0] if err.args else err}\n")
    where = args.transferred or args.out.with_suffix(".annotations.tsv")
    tables = found.Tables(str(args.out), transferred=str(where) if args.annotations else None)
    found.write_tables(tables, hits, query_ids, ids, annotations, args.metric, {})
    if args.annotations:
        unmatched = found.unmatched_line(annotations, ids, args.annotations, args.reference)
        if unmatched:
            say(unmatched)
        say(f"wrote {args.out} and {where}")
    else:
        say(f"wrote {args.out}")
    return 0


def search(queries: Embeddings, reference: Embeddings, args):
    """The hits of every query, and the reference's IDs; the k past the reference said."""
    layer = found.comparable_layer(queries, reference, args.layer)
    itself = Path(queries.name).resolve() == Path(reference.name).resolve()
    available = len(reference) - (1 if itself else 0)
    if args.k > available:
        say(
            f"-k {args.k} asks for more than {reference.name} holds: each query gets "
            f"{available} neighbour{'s' if available != 1 else ''}"
        )
    vectors = np.asarray(queries.array("mean", layer), dtype=np.float32)
    own = np.arange(len(queries)) if itself else None
    k = min(args.k, max(available, 1))
    # torch's top k on the CPU: about 2.5 times numpy's partition (esmshard.steps.neighbours)
    hits = found.search(vectors, reference, layer, k, args.metric, own, device="cpu")
    return hits, reference.ids()
