"""The variants table (`variants:`): substitutions to score, in the convention of fair-esm's
`predict.py` and ProteinGym.

A CSV or TSV file (a tab in its first line makes it TSV) with a `mutant` column: `H24C` (wild
type, 1-based position in the record's sequence, mutant), several substitutions joined by `:`
(`H24C:G45D`), a stop-gain on its own (`K17*`: scored as esm-variants' `get_minLLR`, the least
score of any substitution from the stop to the protein's end), and an `id` column naming the
record (optional where the input has one record). Its positions count from `variant_offset`.
Other columns are kept: the scores come back beside them. `variants: all` stands for every
single substitution of every record instead: its residues' 19 others each, in the order of
AMINO_ACIDS.

`pseudo_ppl` scores each mutant sequence by its own pseudo-log-likelihood: the mutants are
written as a FASTA file of their own (`write_mutants`), one record per variant named by
`mutant_id`, and embedded by the workflow's own shard, embed and merge steps with `include:
[pll]`.

Every problem of a table is one line naming its file and line, found before any job (`problems`).
"""

import csv
import re
from typing import NamedTuple

from ..embeddings_h5.scores import AMINO_ACIDS, LOGITS, MASKED_MARGINALS, PLL
from .changes import Change, crop, first_difference
from .fasta import FastaError, printable, read_raw

ALL = "all"
# variant_scoring: each strategy that reads the records' own scores, and the kind of `include`
# whose values it reads
STRATEGIES = {"wt_marginals": LOGITS, "masked_marginals": MASKED_MARGINALS}
PSEUDO_PPL = "pseudo_ppl"  # the mutant sequences' own pseudo-log-likelihoods
PLLR = "pllr"  # esm-variants' get_PLLR: one-pass PLLs, cropped around the change
# the strategies whose sequences are a run of their own (the mutants'), and the kind each reads
MUTANT_KINDS = {PSEUDO_PPL: PLL, PLLR: LOGITS}
ORDER = [*STRATEGIES, PSEUDO_PPL, PLLR]  # the strategies' columns of the output, in this order
WILD_TYPE_PLL = "pseudo_ppl_wild_type"  # beside pseudo_ppl: the wild type's own PLL
SCORES = [*ORDER, WILD_TYPE_PLL]  # every column of scores the output may have
SUBSTITUTION = re.compile(r"([A-Za-z])(\d+)([A-Za-z*])")
STOP = "*"  # a stop-gain's mutant: K17*
MUTATED, START = "mutated_sequence", "start_pos"  # a change given whole (ProteinGym's indels)
SHOWN = 5  # problems named one by one; the rest counted
# Substitutions that a table needs before one other variant_offset fitting them all is said:
# the wild type of a single one is found at many places of its record.
MIN_FITTED = 3


class VariantsError(ValueError):
    """A variants table that cannot be read; the message names its file and line."""


class Substitution(NamedTuple):
    wild: str
    position: int  # 1-based
    mutant: str


class Variant(NamedTuple):
    id: str | None  # None: the input's one record
    mutant: str  # as the table writes it
    substitutions: tuple[Substitution, ...]  # positions in the record, from 1
    where: str  # "file:line"
    cells: tuple[str, ...] = ()  # the table's line, a cell per column, as written
    mutated: str | None = None  # its `mutated_sequence`: the whole mutant sequence
    start: int | None = None  # its `start_pos`, where the change starts in the record

    @property
    def stop(self) -> int | None:
        """A stop-gain's 1-based position (its one substitution's), else None."""
        if not self.substitutions:
            return None
        first = self.substitutions[0]
        return first.position if first.mutant == STOP else None

    @property
    def label(self) -> str:
        """What names it among the mutants: its `mutant`, else its line of the table."""
        return self.mutant or f"line{self.where.rsplit(':', 1)[1]}"


def score_columns(strategies) -> list[str]:
    """The output's columns of scores for `strategies` (in ORDER)."""
    return [*strategies, *([WILD_TYPE_PLL] if PSEUDO_PPL in strategies else [])]


def variant_kinds(strategies) -> list[str]:
    """The scores that `strategies` read: the records' own (STRATEGIES), and the mutants'
    (MUTANT_KINDS)."""
    return [STRATEGIES.get(name) or MUTANT_KINDS[name] for name in strategies if name in ORDER]


def mutant_kinds(strategies) -> list[str]:
    """What the mutants' run computes for `strategies` (none: no mutants' run)."""
    return sorted({MUTANT_KINDS[name] for name in strategies if name in MUTANT_KINDS})


def parse_mutant(text: str) -> tuple[Substitution, ...]:
    """`H24C:G45D` as its substitutions; a ValueError says what is wrong with it."""
    found = []
    for part in text.strip().split(":"):
        match = SUBSTITUTION.fullmatch(part.strip())
        if not match:
            raise ValueError(
                f"mutant {text!r} is not written as wild type, position, mutant (H24C; "
                "several joined by ':')"
            )
        wild, position, mutant = (
            match.group(1).upper(),
            int(match.group(2)),
            match.group(3).upper(),
        )
        for letter in (wild, mutant):
            if letter not in AMINO_ACIDS and letter != STOP:
                raise ValueError(f"mutant {text!r}: {letter} is not one of the 20 amino acids")
        if position < 1:
            raise ValueError(f"mutant {text!r}: positions count from 1")
        found.append(Substitution(wild, position, mutant))
    if len(found) > 1 and any(s.mutant == STOP for s in found):
        raise ValueError(
            f"mutant {text!r}: a stop-gain (K17*) ends the protein: write it on a line of its own"
        )
    positions = [s.position for s in found]
    if len(set(positions)) < len(positions):
        raise ValueError(f"mutant {text!r} changes one position twice")
    return tuple(found)


class Table(NamedTuple):
    columns: list[str]  # as the table names them, in its order
    variants: list[Variant]


def read_table(path, offset: int = 1) -> tuple[Table, list[str]]:
    """The table's variants, their positions made the record's (the table numbers the first
    residue `offset`: fair-esm predict.py's `--offset-idx`), and a line per problem of its own
    (unreadable, no `mutant` column, a column named as a strategy, a mutant written wrong)."""
    table = Table([], [])
    try:
        # utf-8-sig: the byte-order mark that Excel's "CSV UTF-8" puts before the first column
        with open(path, newline="", encoding="utf-8-sig") as fh:
            first = fh.readline()
            fh.seek(0)
            rows = csv.DictReader(fh, delimiter="\t" if "\t" in first else ",")
            columns = list(rows.fieldnames or [])
            if "mutant" not in columns and MUTATED not in columns:
                return table, [
                    f"variants: {path} has no `mutant` column (its columns: "
                    f"{', '.join(columns) or 'none'}); give a CSV or TSV with "
                    "`mutant` (H24C) and `id` columns, or `mutated_sequence`"
                ]
            taken = [name for name in columns if name in SCORES]
            if taken:  # variant_scores.tsv gives each strategy a column of that name
                return table, [
                    f"variants: {path} has a column named as a strategy's scores "
                    f"({', '.join(taken)}); rename it"
                ]
            table = Table(columns, [])
            problems = []
            for line, row in enumerate(rows, start=2):
                where = f"{path}:{line}"
                text = (row.get("mutant") or "").strip()
                mutated = (row.get(MUTATED) or "").strip().upper() or None
                try:
                    written = parse_mutant(text) if text or not mutated else ()
                    start = _start(row.get(START) or "", offset)
                    if mutated and set(mutated) - set(AMINO_ACIDS):
                        wrong = sorted(set(mutated) - set(AMINO_ACIDS))[0]
                        raise ValueError(f"mutated_sequence holds {wrong}, which is not one of "
                                         "the 20 amino acids")  # fmt: skip
                except ValueError as err:
                    problems.append(f"variants: {where}: {err}")
                    continue
                substitutions = tuple(
                    s._replace(position=s.position - offset + 1) for s in written
                )
                before = [w.position for w, s in zip(written, substitutions) if s.position < 1]
                if before:
                    problems.append(f"variants: {where}: position {before[0]} is before the "
                                    f"record's first residue, {offset} (variant_offset)")  # fmt: skip
                    continue
                id_ = (row["id"] or "").strip() if "id" in columns else None
                cells = tuple(row[name] or "" for name in columns)
                variant = Variant(id_, text, substitutions, where, cells, mutated, start)
                table.variants.append(variant)
    except (OSError, UnicodeDecodeError, csv.Error) as err:
        return table, [f"variants: {path} cannot be read as a CSV or TSV table ({err})"]
    if not table.variants and not problems:
        problems.append(f"variants: {path} holds no variant; give one per line under `mutant`")
    return table, problems


def _start(cell: str, offset: int) -> int | None:
    """A `start_pos` cell as the record's 1-based position (None: empty)."""
    if not cell.strip():
        return None
    if not cell.strip().isdigit() or int(cell) - offset + 1 < 1:
        raise ValueError(f"start_pos {cell.strip()!r} is not a residue's number (from {offset})")
    return int(cell) - offset + 1


def change_of(variant: Variant, sequence: str) -> Change | None:
    """What a variant changes in its record's `sequence` as `pllr` scores it: its
    `mutated_sequence` (starting at `start_pos`, else where it first differs), or its
    substitutions made; None for a stop-gain."""
    if variant.mutated:
        start = variant.start or first_difference(sequence, variant.mutated) or 1
        return Change(sequence, variant.mutated, start)
    if variant.stop:
        return None
    first = min(s.position for s in variant.substitutions)
    return Change(sequence, mutated(sequence, variant.substitutions), first)


def mutant_id(record_id: str, mutant: str) -> str:
    """The ID of a variant's mutant sequence among the mutants (`write_mutants`)."""
    return f"{record_id}/{mutant}"


def wild_type_id(record_id: str) -> str:
    """The ID of a record's own sequence among the mutants: `pseudo_ppl` is each mutant's PLL
    minus its wild type's. (No mutant is written `wild_type`.)"""
    return mutant_id(record_id, "wild_type")


def mutated(sequence: str, substitutions) -> str:
    """`sequence` with `substitutions` made."""
    letters = list(sequence)
    for s in substitutions:
        letters[s.position - 1] = s.mutant
    return "".join(letters)


def single_substitutions(sequence: str) -> list[tuple[int, str]]:
    """Every single substitution of `sequence` (`variants: all`): (0-based position, mutant),
    position-major, the amino acids in order; positions holding X and the like have none."""
    return [
        (p, a) for p, wild in enumerate(sequence) if wild in AMINO_ACIDS
        for a in AMINO_ACIDS if a != wild
    ]  # fmt: skip


def substitution_name(sequence: str, position: int, mutant: str, offset: int = 1) -> str:
    """A single substitution as the table's `mutant` column writes it (0-based `position`,
    numbered from `offset`): `H24C`."""
    return f"{sequence[position]}{position + offset}{mutant}"


class Mutants(NamedTuple):
    """What the mutants' run computes (`pseudo_ppl`, `pllr`): its sequences and their forward
    passes (with `pseudo_ppl`, a pass per residue and one unmasked, as for a record's masked
    marginals; with `pllr` alone, one each)."""

    sequences: int
    passes: int
    tokens: int  # the passes' tokens, BOS and EOS included: what their time goes on

    def plus(self, sequences: int, passes: int, length: int) -> "Mutants":
        """With `sequences` more of `length` residues, `passes` forward passes in all."""
        return Mutants(
            self.sequences + sequences, self.passes + passes, self.tokens + passes * (length + 2)
        )


def pllr_id(record_id: str, label: str, part: str) -> str:
    """The ID of a `pllr` sequence cropped around a change: its wild type's or its mutant's."""
    return f"{record_id}/{label}/pllr_{part}"


def mutants_of(inputs, variants, limit, offset=1, strategies=(PSEUDO_PPL,), window=None):
    """(ID, sequence) of each sequence that `strategies` read from the mutants' run, for the
    variants of `variants` (a table's path numbering residues from `offset`, or "all") over the
    input FASTA files, each ID once: with `pseudo_ppl`, each record's own and each variant's
    mutant, truncated at `limit` residues as the records are (None: whole,
    esmshard.input.long_sequences.scored_limit); with `pllr` (a table's), each variant's wild
    type and mutant cropped to `window` residues around the change (esmshard.input.changes),
    named as pseudo_ppl's where they are whole."""
    seen = set()
    if variants == ALL:  # pllr scores a table's rows alone (esmshard.steps.checks)
        for path in inputs:
            for record in read_raw(str(path)):
                sequence = record.sequence.decode("ascii")[:limit]
                yield wild_type_id(record.id), sequence
                for p, a in single_substitutions(sequence):
                    name = mutant_id(record.id, substitution_name(sequence, p, a, offset))
                    yield name, f"{sequence[:p]}{a}{sequence[p + 1 :]}"
        return

    def once(name, sequence):
        if name not in seen:
            seen.add(name)
            yield name, sequence

    table = read_table(variants, offset)[0].variants
    ids = {v.id for v in table}
    sequences = sequences_of(inputs, None if None in ids else ids)
    only = next(iter(sequences), "")
    for variant in table:
        record_id = variant.id if variant.id is not None else only
        if record_id not in sequences:
            continue
        sequence = sequences[record_id]
        change = change_of(variant, sequence)
        if change is None:  # a stop-gain: no mutant sequence, its cells left empty
            continue
        if PSEUDO_PPL in strategies:
            yield from once(wild_type_id(record_id), sequence[:limit])
            yield from once(mutant_id(record_id, variant.label), change.mutant[:limit])
        if PLLR in strategies:
            for name, cropped in pllr_sequences(record_id, variant, change, window):
                yield from once(name, cropped)


def pllr_sequences(record_id: str, variant: Variant, change: Change, window: int):
    """(ID, sequence) of the wild type and the mutant that `pllr` scores a variant's `change`
    with, cropped to `window` residues around it; whole ones named as pseudo_ppl's."""
    wild, mutant = crop(change, window)
    whole = (wild_type_id(record_id), mutant_id(record_id, variant.label))
    return [
        (whole[k] if cropped == full else pllr_id(record_id, variant.label, part), cropped)
        for k, (part, cropped, full) in enumerate(
            (("wild_type", wild, change.wild), ("mutant", mutant, change.mutant))
        )
    ]


def passes_of(sequence: str, strategies) -> int:
    """The forward passes of one of the mutants' run's sequences."""
    return len(sequence) + 1 if PSEUDO_PPL in strategies else 1


def write_mutants(
    inputs, variants, limit, out_fasta, offset=1, strategies=(PSEUDO_PPL,), window=None
) -> Mutants:
    """The sequences of the mutants' run (`mutants_of`) as a FASTA file, written atomically."""
    from ..files import atomic_path

    work = Mutants(0, 0, 0)
    with atomic_path(out_fasta) as tmp, open(tmp, "w", encoding="ascii") as fh:
        for name, sequence in mutants_of(inputs, variants, limit, offset, strategies, window):
            fh.write(f">{name}\n{sequence}\n")
            work = work.plus(1, passes_of(sequence, strategies), len(sequence))
    return work


def mutants_work(
    inputs, variants, limit, offset=1, strategies=(PSEUDO_PPL,), window=None
) -> Mutants:
    """What `write_mutants` would write, counted without writing it: said before the run."""
    work = Mutants(0, 0, 0)
    if variants == ALL:  # counted from the records: their mutants may be many millions
        for path in inputs:
            for record in read_raw(str(path)):
                sequence = record.sequence.decode("ascii")[:limit]
                # its substitutions, and the record itself (its wild type)
                mutants = (len(AMINO_ACIDS) - 1) * sum(sequence.count(a) for a in AMINO_ACIDS) + 1
                work = work.plus(mutants, mutants * (len(sequence) + 1), len(sequence))
        return work
    for _, sequence in mutants_of(inputs, variants, limit, offset, strategies, window):
        work = work.plus(1, passes_of(sequence, strategies), len(sequence))
    return work


def sequences_of(inputs, ids: set[str] | None) -> dict[str, str]:
    """The normalised sequences of the records `ids` of the input FASTA files (None: the first
    two records, to tell whether the input holds one)."""
    found = {}
    for path in inputs:
        for record in read_raw(str(path)):
            if ids is None or record.id in ids:
                found[record.id] = record.sequence.decode("ascii")
                if ids is None and len(found) == 2:
                    return found
    return found


def problems(path, inputs, limit: int | None, offset: int = 1) -> list[str]:
    """Why the table at `path` (numbering residues from `offset`) cannot be scored against the
    input FASTA files `inputs`, whose records are scored up to `limit` residues (None: whole):
    one line each, naming the table's line."""
    table, found = read_table(path, offset)
    if table.variants:
        found += _record_problems(path, table.variants, inputs, limit, offset)
    if len(found) > SHOWN:
        found = found[:SHOWN] + [f"variants: and {len(found) - SHOWN} more lines of {path}"]
    return found


def _record_problems(
    path, variants: list[Variant], inputs, limit: int | None, offset: int
) -> list[str]:
    """Why variants do not fit their records: no such record, a position beyond it, another
    wild type; where every wild type fits at one other `variant_offset`, one line saying so."""
    found = []
    ids = {v.id for v in variants}
    try:
        sequences = sequences_of(inputs, None if None in ids else ids)
    except (FastaError, OSError):
        return []  # the shard step names the input's problem
    if None in ids and len(sequences) != 1:
        return [
            f"variants: {path} has no `id` column and the input holds more than one record; add "
            "an `id` column naming each variant's record"
        ]
    only = next(iter(sequences.values()), "")
    misplaced = 0  # variants whose wild type is not where the table puts it
    for variant in variants:
        sequence = only if variant.id is None else sequences.get(variant.id)
        if sequence is None:
            found.append(f"variants: {variant.where}: no input record has the ID "
                         f"'{printable(variant.id)}'")  # fmt: skip
            continue
        embedded = len(sequence) if limit is None else min(len(sequence), limit)
        for s in variant.substitutions:
            if s.position > embedded:
                beyond = (
                    f"the {len(sequence)} residues of its record"
                    if s.position > len(sequence)
                    else f"the {limit} residues embedded (truncation_seq_length; "
                    "long_sequences: chunk scores every residue of a longer protein)"
                )
                found.append(f"variants: {variant.where}: {variant.mutant}: position "
                             f"{s.position + offset - 1} is beyond {beyond}")  # fmt: skip
                misplaced += s.position > len(sequence)
                break
            if sequence[s.position - 1] != s.wild:
                found.append(
                    f"variants: {variant.where}: {variant.mutant}: the record has "
                    f"{sequence[s.position - 1]} at {s.position + offset - 1}, not {s.wild}; "
                    f"positions count from {offset} in the record's sequence (variant_offset)"
                )
                misplaced += 1
                break
        else:
            problem = _change_problem(variant, sequence, offset)
            if problem:
                found.append(f"variants: {variant.where}: {problem}")
    if misplaced and misplaced == len(found):
        fits = _fitting_offset(variants, sequences, only, offset)
        if fits is not None:
            return [
                f"variants: {path}: {misplaced:,} of its {len(variants):,} variants' wild types "
                f"are not at the positions written, and every one is with variant_offset={fits} "
                f"(the table numbers the record's first residue {fits}); set variant_offset={fits}"
            ]
    return found


def _change_problem(variant: Variant, sequence: str, offset: int) -> str | None:
    """Why a variant's `mutated_sequence` cannot be scored against its record's `sequence`."""
    if not variant.mutated:
        return None
    if variant.start and variant.start > len(sequence) + 1:
        return (f"start_pos {variant.start + offset - 1} is past the end of its record "
                f"({len(sequence)} residues)")  # fmt: skip
    if variant.mutated == sequence:
        return "mutated_sequence is its record's own sequence: it changes nothing"
    if variant.substitutions and mutated(sequence, variant.substitutions) != variant.mutated:
        return (f"mutant {variant.mutant} and mutated_sequence disagree: its substitutions make "
                "another sequence; give one of them, or both alike")  # fmt: skip
    return None


def _fitting_offset(variants, sequences: dict[str, str], only: str, offset: int) -> int | None:
    """The one `variant_offset` at which every substitution's wild type is its record's
    residue, if there is one and the table has the MIN_FITTED substitutions that tell it."""
    if sum(len(v.substitutions) for v in variants) < MIN_FITTED:
        return None
    shifts = None  # what may be added to every position
    for variant in variants:
        sequence = only if variant.id is None else sequences[variant.id]
        for s in variant.substitutions:
            at = s.position - 1
            if shifts is None:
                shifts = {i - at for i, letter in enumerate(sequence) if letter == s.wild}
            shifts = {
                d for d in shifts if 0 <= at + d < len(sequence) and sequence[at + d] == s.wild
            }
            if not shifts:
                return None
    return offset - shifts.pop() if len(shifts) == 1 else None
