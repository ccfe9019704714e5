"""The reference's annotations: a CSV or TSV with an `id` column and the columns to carry over
to each query's neighbours, in wide form (a row per ID) or long form (a row per ID and value, as
GOA writes GO terms).

An ID's rows are one annotation: each column's distinct values in the order met, joined by `;`.
A column named as one of the tables' own (`rank`, `distance`, ...) is carried as
`annotation_<name>`, so that the tables keep their columns. The file is read as UTF-8, with or
without a byte-order mark (Excel's "CSV UTF-8").
"""

import csv
import io
from codecs import BOM_UTF8
from pathlib import Path

TABLE_COLUMNS = ("id", "rank", "neighbour", "distance", "reliability_index")
CARRIED_PREFIX = "annotation_"
JOINED_BY = ";"
HEAD_BYTES = 1 << 16  # what the config's check reads: the header and the first rows


class AnnotationsError(ValueError):
    """An annotations file that cannot be read as one; the message names it and what to do."""


def read_annotations(path, head: bool = False) -> dict[str, dict[str, str]]:
    """Each ID's carried columns; `head`: only the file's first rows, as a check before any job.
    AnnotationsError in one line where the file cannot be used."""
    rows, columns = parsed(path, text_of(Path(path), head))
    carried = carried_names(columns)
    found: dict[str, dict[str, list[str]]] = {}
    for row in rows:
        if not row[0]:
            continue
        values = found.setdefault(row[0], {name: [] for name in carried})
        for name, value in zip(carried, row[1:]):
            if value and value not in values[name]:
                values[name].append(value)
    return {
        id_: {name: JOINED_BY.join(v) for name, v in values.items()}
        for id_, values in found.items()
    }


def text_of(path: Path, head: bool) -> str:
    """The file's text (`head`: its first whole lines); UTF-8's errors named by line and byte."""
    try:
        with open(path, "rb") as fh:
            data = fh.read(HEAD_BYTES) if head else fh.read()
    except IsADirectoryError:
        raise AnnotationsError(f"{path} is a folder: give the annotations' CSV or TSV") from None
    except OSError as err:
        raise AnnotationsError(
            f"{path}: {err.strerror}: give the annotations' CSV or TSV"
        ) from None
    if head and len(data) == HEAD_BYTES and b"\n" in data:
        data = data[: data.rindex(b"\n") + 1]
    mark = len(BOM_UTF8) if data.startswith(BOM_UTF8) else 0
    try:
        return data[mark:].decode("utf-8")
    except UnicodeDecodeError as err:
        at = mark + err.start
        line = data[:at].count(b"\n") + 1
        raise AnnotationsError(
            f"{path}:{line}: byte {at} (0x{data[at]:02x}) is not UTF-8: save the file as UTF-8 "
            "(in Excel: CSV UTF-8)"
        ) from None


def parsed(path, text: str) -> tuple[list[list[str]], list[str]]:
    """The rows (the ID first) and the header of a CSV or TSV (a tab in the header: TSV)."""
    header = text.split("\n", 1)[0]
    delimiter = "\t" if "\t" in header else ","
    table = [row for row in csv.reader(io.StringIO(text), delimiter=delimiter) if row]
    if not table:
        raise AnnotationsError(f"{path} is empty: give a CSV or TSV with an `id` column")
    columns = [name.strip() for name in table[0]]
    if "id" not in columns:
        raise AnnotationsError(
            f"{path}: no `id` column in its header ({', '.join(columns[:4])}"
            f"{', ...' if len(columns) > 4 else ''}): name the column of the reference's IDs `id`"
        )
    if len(table) == 1:
        raise AnnotationsError(
            f"{path} holds a header but no rows: give the reference proteins' annotations"
        )
    at = columns.index("id")
    order = [at, *(i for i in range(len(columns)) if i != at)]
    width = len(columns)
    rows = [[(row + [""] * width)[i] for i in order] for row in table[1:]]
    return rows, [columns[i] for i in order[1:]]


def carried_names(columns: list[str]) -> list[str]:
    """The columns as the tables carry them: a table's own name prefixed, until it is free."""
    names = []
    for column in columns:
        name = column
        while name in TABLE_COLUMNS or name in names:
            name = CARRIED_PREFIX + name
        names.append(name)
    return names


def annotation_columns(annotations: dict[str, dict[str, str]]) -> list[str]:
    """The carried columns, in the file's order."""
    return list(next(iter(annotations.values()), {}))


def unmatched_line(annotations: dict, reference_ids, table, reference) -> str | None:
    """The line that counts the IDs of the annotations' `table` absent from `reference`'s
    `reference_ids` (they carry nothing over), or None where all are there."""
    present = set(reference_ids)
    missing = [name for name in annotations if name not in present]
    if not missing:
        return None
    return (
        f"{len(missing):,} of the {len(annotations):,} IDs of {table} are not in {reference} "
        f"(e.g. {missing[0]}): they carry nothing over"
    )
