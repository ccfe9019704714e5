"""`esmshard.embed` (esmshard.api.calls): embeddings in the calling process, by the workflow's own steps.

    emb = esmshard.embed({"P1": "MKTAYIAKQR", "P2": "MSHHWGYGKH"}, "esm2_t33_650M_UR50D")
    emb["P1"].mean[33]

The sequences go through the shard step (the same input checks, deduplication and store), one
embed job per shard on a device of the GPU pool (the same batching, precision, long-sequence
policy and out-of-memory back-off), and the merge step, in a temporary folder; the result is
read like `esmshard.open_embeddings` and held in memory. Settings take the workflow's config
keys and defaults (config/config.yaml), validated by the same schema.
"""

import contextlib
import io
import logging
import sys
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import yaml

from ..commands.launch import workflow_root
from ..compute.pool import no_usable_gpu
from ..config import ConfigError, embedding_settings
from ..files import unwritable, write_json
from ..input.given import Sequences, fasta_of, given_by_item
from ..input.sizing import ModelSize, cpu_memory_problem, host_memory_bytes
from ..layout import Layout
from ..models import ModelError, ModelSpec, attention_values, ensure_available, parse_spec
from ..outputs.reader import Embeddings, read_failed
from ..steps.checks import check_config, defaults
from ..steps.embed import run_shard
from ..steps.merge import merge
from ..steps.shard import write_shards
from ..store import Store, read_json_object, settings_key
from ..store.leftovers import remove_leftovers
from ..store.pieces import Pieces
from ..store.runlock import new_run
from ..store.storelock import shared

log = logging.getLogger(__name__)


def schema() -> dict:
    with open(workflow_root() / "workflow" / "schemas" / "config.schema.yaml") as fh:
        return yaml.safe_load(fh)


def settings_of(options: dict, model) -> dict:
    """The workflow's config: its schema's defaults, then `options`, coerced and checked as a
    run's are (esmshard.steps.checks); ConfigError naming every setting that cannot work."""
    config_schema = schema()
    # Tuples, ranges and numpy arrays as the lists (of plain numbers) that the schema takes.
    lists = {
        key: [item.item() if hasattr(item, "item") else item for item in value]
        for key, value in options.items()
        if isinstance(value, Iterable) and not isinstance(value, (str, bytes, Mapping))
    }
    checked = check_config(
        {**defaults(config_schema), **options, **lists}, config_schema, inputs=False, model=model
    )
    if checked.problems:
        raise ConfigError("; ".join(checked.problems))
    return checked.config


@contextlib.contextmanager
def saying_what_is_kept(store: Store, key: str, shards: list[str], computing: int):
    """Where the block stops (an exception), say what of the call's work `store` keeps: the
    parts of its `shards` that are in place."""
    try:
        yield
    except BaseException:
        manifests = [Path(store.manifest(key, shard)) for shard in shards]
        count = sum((read_json_object(m) or {}).get("n_sequences", 0) for m in manifests
                    if m.exists())  # fmt: skip
        if count:
            log.warning(
                "esmshard.embed stopped: %d of the %d sequences it was computing are kept in "
                "the store %s; call it again with this store to compute only the rest",
                count,
                computing,
                store.root,
            )
        raise


def embed_in_process(sequences: Sequences, settings: dict) -> Embeddings:
    """Embed `sequences` with the config keys `settings` through the shard, embed and merge
    steps in a temporary folder, and return the result held in memory (esmshard.api.calls.embed)."""
    import torch  # imported whole by esmshard.api.calls.embed, a Ctrl-C deferred

    with tempfile.TemporaryDirectory(prefix="esmshard-embed-") as tmp:
        call = Call.of(settings, Path(tmp))
        fasta = fasta_of(sequences, Path(tmp), call.config["nucleotide_check"])
        if not torch.cuda.is_available():
            check_cpu_run(call.spec, call.config)
        ensure_available(call.spec)
        call.compute(given_by_item(write_shards, fasta, Path(tmp)), fasta, torch.get_num_threads())
        failed = read_failed(call.run.failed)
        return Embeddings(io.BytesIO(Path(call.run.embeddings).read_bytes()), failed)


def check_cpu_run(spec, config: dict) -> None:
    """Refuse a model too large for this host's memory, and warn of GPUs asked for that cannot
    be used, as a run's start does (RunStart.say_no_usable_gpu)."""
    too_large = cpu_memory_problem(spec.name, spec.params, host_memory_bytes())
    if too_large:
        raise ModelError(too_large.replace("an embed job needs", "it needs"))
    why = no_usable_gpu(config["gpus"])
    if why:
        log.warning("esmshard.embed: gpus %s, but %s: computing on the CPU instead",
                    config["gpus"], why)  # fmt: skip


@dataclass
class Call:
    """One call's run: its checked `config`, model `spec`, `run` layout and `store`."""

    config: dict
    spec: ModelSpec
    run: Layout
    store: Store

    @classmethod
    def of(cls, settings: dict, tmp: Path) -> "Call":
        """Check the call's `settings` as a run's config, its outdir and store (where none is
        given) in the temporary folder `tmp`."""
        if settings["output_values"] == "in_place":
            raise ConfigError(
                "output_values: in_place leaves a run's values in its store, for runs (esmshard "
                "run, snakemake); esmshard.embed returns them in memory: leave it out"
            )
        spec = parse_spec(str(settings["model"]))
        options = {
            **settings,
            "model": str(settings["model"]),
            "store": str(settings["store"] or ""),
        }
        options |= {"input": [str(tmp / "sequences.fasta")], "outdir": str(tmp / "out")}
        config = settings_of(options, spec)
        return cls(
            config, spec, Layout(config["outdir"]), Store(config["store"] or str(tmp / "store"))
        )

    def compute(self, write_shards, fasta: Path, threads: int) -> None:
        """Run the shard step on `fasta`, each shard's embed job, and the merge step, holding
        the store's key as a run does where the store is the caller's."""
        params = embedding_settings(self.config, self.spec.family.name,
                                    self.spec.identity(self.run.checksums))  # fmt: skip
        key = settings_key(params)
        # The store's key held as a run holds it: maintenance beside the call is refused.
        kept = bool(self.config["store"]) and not unwritable(self.store.root)
        held = shared(self.store.root, key, f"esmshard.embed in {' '.join(sys.argv)}")
        with held if kept else contextlib.nullcontext(), contextlib.ExitStack() as stack:
            if kept:  # what killed calls and runs left in the store, as a run's start removes
                remove_leftovers(self.run.outdir, self.store)
            # the call is the command whose jobs' work merge counts as this command's
            Path(self.run.run_lock).parent.mkdir(parents=True, exist_ok=True)
            write_json(self.run.run_lock, new_run())
            plan = self.plan(write_shards, fasta, params)
            shards = [p["shard"] for p in plan["shards"]]
            if kept:
                stack.enter_context(saying_what_is_kept(self.store, key, shards, plan["computed"]))
            for shard in shards:
                # No later call runs this shard: a stopped one keeps what it finished as the
                # shard's part; any pieces left (a second stop while it makes it) go (a killed
                # call leaves its open piece, which the next call or run removes).
                stack.callback(Pieces(self.store, key, shard).remove)
                self.embed_shard(shard, params, key, threads)
            self.merge(shards, params)

    def plan(self, write_shards, fasta: Path, params: dict) -> dict:
        """Run the shard step on `fasta` and return its plan."""
        config = self.config
        return write_shards(
            [fasta],
            self.run.shard_dir,
            config["shards"],
            config["truncation_seq_length"],
            ModelSize(self.spec.params, self.spec.embed_dim),
            self.store.root,
            params,
            self.run.checksums,
            config["long_sequences"],
            config["nucleotide_check"],
            attention_values=attention_values(self.spec, config),
        )

    def embed_shard(self, shard: str, params: dict, key: str, threads: int) -> None:
        """Run one shard's embed job, on the caller's `threads`, keeping a stopped one's work."""
        run, config = self.run, self.config
        run_shard(
            run.shard_tsv(shard),
            self.store.part(key, shard),
            self.store.manifest(key, shard),
            run.metrics(shard),
            shard=shard,
            settings=params,
            toks_per_batch=config["toks_per_batch"],
            gpus=config["gpus"],
            batching=config["batching"],
            compile=config["compile"],
            keep_every=0,
            stopped_keeps="part",
            threads=threads,
            progress_json=run.progress(shard),
            telemetry_tsv=run.telemetry(shard),
            outdir=run.outdir,
        )

    def merge(self, shards: list[str], params: dict) -> None:
        """Run the merge step: embeddings.h5, read back into memory, store or not."""
        run, config = self.run, self.config
        merge(
            run.records,
            run.plan_json,
            self.store.root,
            run.embeddings,
            run.failed,
            run.run_json,
            params,
            run.checksums,
            config["output_dtype"],
            config["per_residue_compression"],
            config["contacts_dtype"],
            [run.metrics(shard) for shard in shards],
            run_lock=run.run_lock,
            output_values="copy",
        )
