"""Where each file of a run lies under its outdir: the rules, the jobs and `esmshard status` read it here.

Paths are strings, so that the rules can pass a wildcard such as "{shard}" for the shard.
"""

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

# A `neighbours` search job's part as its files name it: "i-of-n"
PART_NAME = re.compile(r"^(\d+)-of-(\d+)$")


class NeighbourPart(NamedTuple):
    """A `neighbours` search job's share of the reference's rows: the `index`-th of `count`."""

    index: int
    count: int

    @classmethod
    def named(cls, name: str) -> "NeighbourPart | None":
        """The part named `name` ("i-of-n"), or None for another name."""
        found = PART_NAME.match(name)
        return cls(*map(int, found.groups())) if found else None

    @property
    def name(self) -> str:
        return f"{self.index}-of-{self.count}"


@dataclass(frozen=True)
class Layout:
    outdir: str

    def _path(self, *parts) -> str:
        return os.path.join(self.outdir, *parts)

    @property
    def shard_dir(self) -> str:
        return self._path("shards")

    @property
    def records(self) -> str:
        return self._path("shards", "records.parquet")

    @property
    def plan(self) -> str:
        return self._path("shards", "plan.tsv")

    def shard_tsv(self, shard: str) -> str:
        return self._path("shards", f"{shard}.tsv")

    def metrics(self, shard: str) -> str:
        return self._path("metrics", f"{shard}.json")

    def telemetry(self, shard: str) -> str:
        return self._path("telemetry", f"{shard}.tsv")

    def progress(self, shard: str) -> str:
        return self._path("progress", f"{shard}.json")

    @property
    def embeddings(self) -> str:
        return self._path("embeddings.h5")

    @property
    def plan_json(self) -> str:
        """What the run reuses from the store and computes (esmshard.steps.shard.write_shards)."""
        return self._path("shards", "plan.json")

    @property
    def run_json(self) -> str:
        return self._path("run.json")

    @property
    def failed(self) -> str:
        return self._path("failed_sequences.tsv")

    @property
    def neighbours_tsv(self) -> str:
        """Each protein's nearest neighbours in the `neighbours` reference (esmshard.steps.neighbours),
        the same as Parquet, and each protein's nearest annotated neighbour's annotation."""
        return self._path("neighbours.tsv")

    @property
    def neighbours_parquet(self) -> str:
        return self._path("neighbours.parquet")

    @property
    def annotations_tsv(self) -> str:
        return self._path("annotations.tsv")

    @property
    def transfer_tsv(self) -> str:
        """The terms carried to each protein, goPredSim's way (esmshard.search.transfer), and
        the same as Parquet."""
        return self._path("transfer.tsv")

    @property
    def transfer_parquet(self) -> str:
        return self._path("transfer.parquet")

    @property
    def neighbours_dir(self) -> str:
        return self._path("neighbours")

    def neighbour_part(self, part: str) -> str:
        """One search job's top k, of the reference rows of `part` ("i-of-n"), and its figures."""
        return os.path.join(self.neighbours_dir, f"{part}.npz")

    def neighbour_metrics(self, part: str) -> str:
        return os.path.join(self.neighbours_dir, f"{part}.json")

    def neighbour_progress(self, part: str) -> str:
        """A running search job's rows done (for `esmshard status`), removed once it ends."""
        return os.path.join(self.neighbours_dir, f"{part}.progress.json")

    @property
    def variant_scores(self) -> str:
        """The variants' scores (esmshard.steps.variants), and the same as a Parquet dataset."""
        return self._path("variant_scores.tsv")

    @property
    def variant_scores_parquet(self) -> str:
        return self._path("variant_scores")

    @property
    def variant_summary(self) -> str:
        """What made the variants' scores, and the step's counts."""
        return self._path("variant_scores.json")

    @property
    def mutants(self) -> "Layout":
        """`pseudo_ppl`'s mutant sequences: a run of their own (shards, metrics, embeddings.h5
        with their pll) under the outdir's mutants/."""
        return Layout(self._path("mutants"))

    @property
    def mutant_sequences(self) -> str:
        """The mutants' FASTA file (esmshard.input.variants.write_mutants), in their run."""
        return self._path("mutants.fasta")

    @property
    def scaling_json(self) -> str:
        return self._path("report", "scaling.json")

    @property
    def scaling_html(self) -> str:
        return self._path("report", "scaling_report.html")

    @property
    def report_figures(self) -> str:
        """The report's plots (PNG) and tables (TSV) as files, for Snakemake's own report."""
        return self._path("report", "figures")

    @property
    def run_lock(self) -> str:
        """Held by the run in progress (esmshard.store.runlock)."""
        return self._path(".esmshard", "run.lock")

    @property
    def run_lease(self) -> str:
        """Held by the run in progress where the outdir is in object storage (esmshard.store.lease)."""
        return self._path(".esmshard", "run.lease")

    @property
    def checksums(self) -> str:
        """The sha256 of inputs, checkpoints and store parts, by file version (esmshard.store.checksums)."""
        return self._path(".esmshard", "checksums.json")

    @property
    def own_files(self) -> list[str]:
        """The files esmshard writes at the outdir's top level."""
        return [
            self.embeddings,
            self.run_json,
            self.failed,
            self.variant_scores,
            self.variant_summary,
            self.neighbours_tsv,
            self.neighbours_parquet,
            self.annotations_tsv,
            self.transfer_tsv,
            self.transfer_parquet,
        ]

    @property
    def own_folders(self) -> list[str]:
        """The outdir's folders that esmshard makes and alone writes in (its files at the top
        level aside): what it may clean up in, recursively."""
        names = ("shards", "metrics", "telemetry", "progress", "logs", "report", ".esmshard",
                 "variant_scores", "mutants", "neighbours")  # fmt: skip
        return [self._path(name) for name in names]

    def log(self, step: str, shard: str | None = None) -> str:
        return (
            self._path("logs", step, f"{shard}.log")
            if shard
            else self._path("logs", f"{step}.log")
        )


def every_attempt(log_path: str) -> str:
    """Where the lines of every attempt of the job logging to `log_path` (a `Layout.log`) are
    kept, appended: Snakemake removes a job's log before it runs the job again, so `logs/`
    holds the latest attempt and `logs/attempts/` every one."""
    parts = Path(log_path).parts
    # The last `logs` folder; a log outside one (a step run on its own) keeps them beside it.
    at = max((i for i, name in enumerate(parts[:-1]) if name == "logs"), default=len(parts) - 2)
    return str(Path(*parts[: at + 1], "attempts", *parts[at + 1 :]))
