"""Every problem the shard step finds in the inputs, reported at once.

The shard step reads every record anyway: it notes each problem here and goes on, and the run
stops with one message that lists them all by kind (the count and the first few places), those
that make a file unusable first, so that the first fix is the one that matters.
"""

from dataclasses import dataclass, field

from .fasta import NUCLEOTIDE_LETTERS, NUCLEOTIDE_MIN_LENGTH, FastaError

SHOWN_AT_MOST = 5  # places a kind lists; it counts the rest


@dataclass(frozen=True)
class Kind:
    title: str  # what is wrong
    unit: str  # what is counted
    advice: str  # what to do


# In the order the message gives them: what makes a file unusable first.
KINDS = {
    "unreadable": Kind(
        "files that cannot be read as FASTA",
        "file",
        "give protein FASTA (plain, gzip, bzip2 or xz)",
    ),
    "nucleotide": Kind(
        "nucleotide sequences where proteins are expected (records of at least "
        f"{NUCLEOTIDE_MIN_LENGTH} letters made only of {', '.join(NUCLEOTIDE_LETTERS)})",
        "record",
        "give the protein FASTA (e.g. the gene caller's .faa), or set nucleotide_check: false "
        "to embed them as they are",
    ),
    "bad_record": Kind(
        "records that cannot be read",
        "record",
        "fix or remove them",
    ),
    "duplicate_id": Kind(
        "duplicate IDs",
        "ID",
        "IDs (the first word of each header) must be unique across all inputs",
    ),
    "too_long": Kind(
        "sequences longer than truncation_seq_length, with long_sequences: fail",
        "sequence",
        "set long_sequences to truncate, chunk or skip, or remove them",
    ),
}


@dataclass
class Found:
    count: int = 0
    places: list[str] = field(default_factory=list)


class InputProblems:
    def __init__(self):
        self.found = {kind: Found() for kind in KINDS}

    def add(self, kind: str, place: str, count: int = 1) -> None:
        """One problem of `kind` (or `count` of them, described together) at `place`."""
        found = self.found[kind]
        found.count += count
        if len(found.places) < SHOWN_AT_MOST:
            found.places.append(place)

    def extend(self, other: "InputProblems") -> None:
        """`other`'s problems after these."""
        for kind, found in other.found.items():
            for place in found.places:
                self.add(kind, place, 0)
            self.found[kind].count += found.count

    def to_dict(self) -> dict:
        return {kind: [found.count, found.places] for kind, found in self.found.items()}

    @classmethod
    def from_dict(cls, data: dict) -> "InputProblems":
        problems = cls()
        for kind, (count, places) in data.items():
            problems.found[kind] = Found(count, places)
        return problems

    def __bool__(self) -> bool:
        return any(found.count for found in self.found.values())

    def message(self) -> str:
        sections = []
        for kind, found in self.found.items():
            if not found.count:
                continue
            more = found.count - len(found.places)
            listed = "; ".join(found.places) + (f"; and {more} more" if more > 0 else "")
            what = KINDS[kind]
            counted = f"{found.count} {what.unit}{'s' if found.count != 1 else ''}"
            advice = what.advice[0].upper() + what.advice[1:]  # a sentence of its own
            sections.append(f"- {what.title} ({counted}): {listed}. {advice}")
        n = len(sections)
        return (
            f"the input has {n} kind{'s' if n > 1 else ''} of problem; nothing was computed. "
            "Fix them all, then run the same command again:\n" + "\n".join(sections)
        )

    def raise_if_any(self) -> None:
        if self:
            raise FastaError(self.message())
