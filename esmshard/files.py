"""Reading and writing the run's files: atomic writes and the TSV tables.

Every file is written under a temporary name of its own writer (host and process in the name,
so two writers never share one) and renamed when complete: a file under its final name is whole.
"""

import csv
import json
import os
import socket
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def atomic_path(path):
    """Yield a temporary path beside `path`; rename it to `path` if the block succeeds, else remove it."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{socket.gethostname()}.{os.getpid()}.tmp")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_text(path, text: str) -> None:
    with atomic_path(path) as tmp:
        Path(tmp).write_text(text)


def write_json(path, data: dict) -> None:
    write_text(path, json.dumps(data, indent=2) + "\n")


def write_tsv(path, columns, rows) -> None:
    with atomic_path(path) as tmp, open(tmp, "w", newline="") as fh:
        writer = csv.writer(fh, delimiter="\t", lineterminator="\n")
        writer.writerow(columns)
        writer.writerows(rows)


def read_tsv(path) -> list[dict]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh, delimiter="\t"))
