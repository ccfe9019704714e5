"""The long-sequence policy: what happens to sequences longer than `truncation_seq_length`.

`truncate` keeps the first residues (as fair-esm does), `chunk` embeds overlapping windows and
stitches them, `skip` lists the record as failed, `fail` stops the run before any GPU work.
"""

from typing import NamedTuple

POLICIES = ("truncate", "chunk", "skip", "fail")


class Span(NamedTuple):
    """One window of a chunked sequence, and the part of it that the stitched result keeps."""

    start: int
    end: int
    keep_from: int
    keep_to: int


def chunk_spans(length: int, window: int) -> list[Span]:
    """Overlapping windows covering `length` residues.

    Consecutive windows overlap by at least a quarter window; each residue is taken from the
    window in which it lies farther from an edge, i.e. each overlap is split at its middle.
    """
    if length <= window:
        return [Span(0, length, 0, length)]
    step = window - window // 4
    starts = list(range(0, length - window, step)) + [length - window]
    spans = []
    for start in starts:
        keep_from = 0
        if spans:
            previous = spans[-1]
            keep_from = (start + previous.end) // 2
            spans[-1] = previous._replace(keep_to=keep_from)
        spans.append(Span(start, start + window, keep_from, start + window))
    return spans


def embedded_residues(length: int, truncation_seq_length: int, long_sequences: str) -> int:
    """Residues of a record that the embed job computes under the policy (0: skipped)."""
    if length <= truncation_seq_length or long_sequences == "chunk":
        return length
    return truncation_seq_length if long_sequences == "truncate" else 0


def scored_limit(truncation_seq_length: int, long_sequences: str) -> int | None:
    """The residues of a record that its scores reach (a variant's positions): all of them
    (None) where long sequences are chunked, else at most `truncation_seq_length`."""
    return None if long_sequences == "chunk" else truncation_seq_length


def skip_reason(length: int, limit: int, long_sequences: str) -> str:
    return (
        f"longer than truncation_seq_length ({length} > {limit} residues); "
        f"skipped (long_sequences: {long_sequences})"
    )
