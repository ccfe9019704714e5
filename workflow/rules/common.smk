import os
import re
import sys
from pathlib import Path

import yaml
from snakemake.common.tbdstring import TBDString
from snakemake.exceptions import WorkflowError


# Which esmshard runs this workflow: in a clone, the clone's own (beside workflow/, for the driver
# and, through PYTHONPATH, for the jobs); else the package installed in the environment (the
# copy of these files inside it, or a deployed workflow, whose files Snakemake fetches one by
# one). That one must be the version this workflow is released with, in esmshard/version.py.
def use_esmshard():
    with open(workflow.source_path("../../esmshard/version.py")) as fh:
        needed = re.search(r'^__version__ = "(.+)"$', fh.read(), re.M).group(1)
    clone = Path(workflow.current_basedir.get_path_or_uri(secret_free=True)).parents[1]
    if (clone / "esmshard" / "__init__.py").is_file():
        sys.path.insert(0, str(clone))
        paths = [str(clone), os.environ.get("PYTHONPATH", "")]  # for the jobs' scripts
        os.environ.update(PYTHONPATH=os.pathsep.join(filter(None, paths)))
    try:
        import esmshard
    except ImportError:
        stop(
            f"this workflow needs esmshard {needed}, which is not installed in the Python "
            f"that runs Snakemake ({sys.executable}): {esmshard_install(needed)} there"
        )
    if esmshard.__version__ != needed:
        stop(
            f"this workflow needs esmshard {needed}, but esmshard {esmshard.__version__} is "
            f"installed ({Path(esmshard.__file__).parent}): {esmshard_install(needed)}"
        )


def esmshard_source():
    """Where pip finds the esmshard of this workflow: its repository at the ref the deployment
    names (a deployed module: `github(..., tag=...)`, or git+file for a local clone); None for
    plain files (no index holds esmshard: they say how to build the wheel)."""
    from snakemake.sourcecache import HostingProviderFile, LocalGitFile

    source = workflow.current_basedir
    if isinstance(source, LocalGitFile):
        return f"git+file://{os.path.abspath(source.repo_path)}@{source.ref}"
    if isinstance(source, HostingProviderFile):
        return f"git+https://{source.host}/{source.repo}@{source.ref}"
    return None


def esmshard_install(needed):
    """The command that installs the esmshard this workflow needs, from where it came."""
    source = esmshard_source()
    if source is None:
        return (
            f"install the esmshard {needed} wheel (`make wheel` in a clone of that release "
            "builds it: pip install dist/esmshard-*.whl)"
        )
    return f"pip install '{source}'"


def stop(*problems):
    """End before any job with one line per problem and exit status 2: an exception raised while
    Snakemake reads the workflow would come with its location lines (and, from `validate`, the
    whole schema)."""
    for problem in problems:
        print(f"esmshard: {problem}", file=sys.stderr)
    sys.exit(2)


use_esmshard()

from esmshard.config import embedding_settings
from esmshard.files import read_tsv, unwritable
from esmshard.input.sizing import (
    ModelSize,
    embed_mem_mb,
    estimated_records,
    io_runtime_minutes,
    records_mem_mb,
    shard_runtime_minutes,
)
from esmshard.embeddings_h5.scores import PLL
from esmshard.input.long_sequences import scored_limit
from esmshard.input.variants import ALL as VARIANTS_ALL, mutant_kinds
from esmshard.models import attention_values
from esmshard.layout import Layout
from esmshard.steps.checks import check_config, defaults
from esmshard.compute.provenance import made_by_of
from esmshard.search.transfer import TIES_SEARCHED
from esmshard.steps.neighbours import (
    LAST,
    SELF,
    part_names,
    parts_of,
    reference_file,
    stored_rows,
    transfer_asked,
)
from esmshard.steps.invocation import PLACEHOLDER, Invocation, StartRefused, command_line
from esmshard.steps.object_run import (
    check_object_run,
    planned_in_object_store,
    see_new_directories,
)
from esmshard.files import is_object_url
from esmshard.store.location import Location, LocationRefused
from esmshard.steps.start import EMBED_THREADS, RunStart
from esmshard.store import Store, settings_key
from esmshard.store.checksums import file_checksums
from esmshard.store.runlock import RunActiveError

# What this command is (a dry run, --lint, which executor), read once from its command line:
# Snakemake's own workflow.dryrun and workflow.local_exec are not yet set while it reads this.
INVOCATION = Invocation.of(command_line(), workflow.remote_exec)
# Where the run's files live (esmshard.store.location): folders, or object storage for jobs
# that share no filesystem (--default-storage-provider s3), where each job fetches what it
# needs of the store (esmshard.steps.object_store). Decided here, once; the rest asks LOCATION.
with open(workflow.source_path("../schemas/config.schema.yaml")) as fh:
    SCHEMA = yaml.safe_load(fh)
try:
    LOCATION = Location.of_run(INVOCATION, {**defaults(SCHEMA), **config})
except LocationRefused as refused:
    stop(str(refused))

# The whole config checked before any job (esmshard.steps.checks): command-line values arrive as
# YAML's base loader reads them ('gpus=[0,1]' as strings) and take the form the schema asks for;
# `~` means the home folder in every path key. `--lint` needs no input.
# In object storage the inputs are objects, checked below with the store's access.
CHECKED = check_config(
    {**defaults(SCHEMA), **config},
    SCHEMA,
    inputs=not (INVOCATION.lint or LOCATION.in_objects),
)
if CHECKED.problems:
    stop(*CHECKED.problems)
config.update(CHECKED.config)

if LOCATION.in_objects:
    LOCATION.hand_to_jobs()
    os.environ.update(INVOCATION.storage_credentials)  # where boto3 reads them
    see_new_directories()
    # (a profile's placeholder bucket is said by the run's start, in its words)
    UNCHECKED = INVOCATION.lint or PLACEHOLDER in LOCATION.store.url
    OBJECT_RUN = check_object_run(
        LOCATION,
        [] if UNCHECKED else config["input"],
        writes=not (UNCHECKED or INVOCATION.remote_job),
    )
    if OBJECT_RUN.problems:
        stop(*OBJECT_RUN.problems)

INPUTS = config["input"]
# What the steps' memory is sized by: the input files, or the objects' sizes.
INPUT_SIZES = OBJECT_RUN.input_bytes if LOCATION.in_objects else INPUTS
MODEL = CHECKED.model
FAMILY = MODEL.family
RUN = Layout(config["outdir"])
STORE = Store(config["store"] or os.path.join(config["outdir"], "store"))
# A store that cannot be written is used for reuse alone (the shard step refuses a run that
# would add to it): no lock is taken in it, nothing cleaned up.
STORE_UNWRITABLE = None if LOCATION.in_objects else unwritable(STORE.root)
MODEL_SIZE = ModelSize(MODEL.params, MODEL.embed_dim)  # read from the model's files

# Settings that change the embeddings: the store keeps what was computed with each (KEY), and
# merge checks every part against them (esmshard.config, esmshard.store).
CHECKPOINT = MODEL.identity(RUN.checksums)  # the weights' identity (a file's: its sha256)
EMBEDDING_PARAMS = embedding_settings(config, FAMILY.name, CHECKPOINT)
KEY = settings_key(EMBEDDING_PARAMS)

# `pseudo_ppl`: the variants' mutant sequences, embedded as a run of their own under
# <outdir>/mutants/ with their pseudo-log-likelihoods alone (esmshard.input.variants).
MUTANTS = RUN.mutants
# The residues of a record that the variants' positions reach (None: whole, chunked).
SCORED_LIMIT = scored_limit(config["truncation_seq_length"], config["long_sequences"])
# pseudo_ppl and pllr read the mutants' run: its pll, its logits (MUTANT_KINDS)
MUTANT_INCLUDE = mutant_kinds(config["variant_scoring"]) if config["variants"] else []
MUTANTS_WANTED = bool(MUTANT_INCLUDE)
MUTANT_PARAMS = embedding_settings(
    {**config, "include": MUTANT_INCLUDE or [PLL]}, FAMILY.name, CHECKPOINT
)
MUTANT_KEY = settings_key(MUTANT_PARAMS)


wildcard_constraints:
    shard=r"[0-9a-f]+-[0-9]+",
    part=r"[0-9]+-of-[0-9]+",


def in_store(path):
    """A file of the store, as the rules name it. An object of a store given as an s3:// URL is
    Snakemake's `storage` object (the other paths take --default-storage-prefix)."""
    return storage(path) if is_object_url(path) else path


def object_urls(paths):
    """The URLs of the run's objects at `paths` (relative to --default-storage-prefix)."""
    return [LOCATION.url(os.path.normpath(path)) for path in paths]


def shard_params(inputs, settings):
    """The shard step's params for `inputs` embedded with `settings` (the records', or the
    mutants' of `pseudo_ppl`)."""
    return dict(
        # New content under an old mtime re-runs this step too (esmshard.store.checksums).
        # (objects: Snakemake's own record of their modification times)
        input_sha256=lambda wildcards: (
            None if LOCATION.in_objects else file_checksums(inputs, RUN.checksums)
        ),
        shards=config["shards"],
        # embed jobs at once, on one machine or a cluster: `shards: auto` makes at least as
        # many shards (on a cluster, where the work allows)
        slots=lambda wildcards: START.parallel_jobs() if config["shards"] == "auto" else None,
        cluster=lambda wildcards: START.on_cluster if config["shards"] == "auto" else None,
        model_size=list(MODEL_SIZE),
        store=STORE.root,
        # in object storage, the inputs' objects by URL (the step reads local copies)
        input_names=object_urls(inputs) if LOCATION.in_objects else None,
        settings=settings,
        # with attention maps: their values per pair of residues, and bytes of one in the output
        attention_values=list(attention_values(MODEL, {**config, **settings})),
        truncation_seq_length=config["truncation_seq_length"],
        long_sequences=config["long_sequences"],
        nucleotide_check=config["nucleotide_check"],
    )


def shard_mem_mb(wildcards, threads):
    """The shard step's memory: streaming, at most ~32 bytes per record (esmshard.steps.shard),
    and each reading process's ~400 MB."""
    return records_mem_mb(INPUT_SIZES, 32) + 400 * threads


def planned_shards(wildcards=None, checkpoint="shard", layout=RUN):
    """A run's shards (the records', or with `shard_mutants` the mutants'): known once its
    shard step (a checkpoint) has read the input and the store."""
    getattr(checkpoints, checkpoint).get()
    if LOCATION.in_objects:  # the step ran on another node: its plan is in the object store
        return planned_in_object_store(LOCATION, layout)
    return [row["shard"] for row in read_tsv(layout.plan)]


def merge_inputs_of(checkpoint, layout, key):
    """The record table, the plan and the shards of a run (`layout`, its settings `key`); the
    store's parts that the run reuses are no job's outputs here, and merge checks them itself."""
    shards = planned_shards(None, checkpoint, layout)
    return {
        "records": layout.records,
        "plan": layout.plan_json,
        # (in object storage, merge fetches the parts itself, with those of earlier runs)
        "shards": [] if LOCATION.in_objects else [STORE.part(key, shard) for shard in shards],
        "metrics": [layout.metrics(shard) for shard in shards],
    }


def variant_table_inputs(wildcards):
    """The input (the records' sequences), and the variants table where one is given
    (`variants: all` has none): what the mutants' FASTA file is made from."""
    found = {"inputs": INPUTS}
    if config["variants"] != VARIANTS_ALL:
        found["table"] = config["variants"]
    return found


def variants_inputs(wildcards):
    """`variant_table_inputs`, embeddings.h5, and with `pseudo_ppl` the mutants' embeddings.h5."""
    found = {"embeddings": RUN.embeddings, **variant_table_inputs(wildcards)}
    if MUTANTS_WANTED:
        found["mutants"] = MUTANTS.embeddings
    return found


# `neighbours`: the reference's embeddings.h5 (the run's own for `self`), the layer compared and
# how many search jobs cut its rows (esmshard.steps.neighbours).
NEIGHBOUR_REFERENCE = reference_file(config["neighbours"], RUN.embeddings)
NEIGHBOUR_LAYER = (
    config["repr_layers"][-1] if config["neighbours_layer"] == LAST else config["neighbours_layer"]
)
# `neighbours_terms`: how the terms are carried (esmshard.search.transfer), or None
TRANSFER = transfer_asked(config)


def unwritten_tables():
    """An earlier search's tables that this one does not write, for its job to remove; none in
    object storage, where the job's folder holds no earlier table (a file there is not ours)."""
    if LOCATION.in_objects:
        return []
    annotations = [] if config["neighbours_annotations"] else [RUN.annotations_tsv]
    transfer = [] if TRANSFER else [RUN.transfer_tsv, RUN.transfer_parquet]
    return annotations + transfer


def neighbour_parts(wildcards=None):
    """The search jobs' parts, by the reference's rows (`self`: the input's records, estimated
    before they are read; each job takes its share of the rows there are)."""
    if config["neighbours"] == SELF:
        rows = estimated_records(INPUT_SIZES)
    else:
        rows = stored_rows(NEIGHBOUR_REFERENCE)
    return part_names(parts_of(config["neighbours_shards"], rows))


def neighbour_part_inputs(wildcards):
    """The queries and the reference; with an ontology, the annotations and the ontology too
    (each aspect is searched among the references annotated in it)."""
    found = {"queries": RUN.embeddings, "reference": NEIGHBOUR_REFERENCE}
    if TRANSFER and TRANSFER.ontology:
        found.update(annotations=config["neighbours_annotations"], ontology=TRANSFER.ontology)
    return found


def neighbours_inputs(wildcards):
    """Every part's top k, the queries, the reference, the annotations and the ontology where
    given."""
    found = {
        "parts": [RUN.neighbour_part(part) for part in neighbour_parts()],
        "queries": RUN.embeddings,
        "reference": NEIGHBOUR_REFERENCE,
    }
    if config["neighbours_annotations"]:
        found["annotations"] = config["neighbours_annotations"]
    if TRANSFER and TRANSFER.ontology:
        found["ontology"] = TRANSFER.ontology
    return found


# Cluster resources (used by profiles/slurm; a profile's set-resources overrides them).


def embed_runtime(wildcards, input, attempt):
    minutes = shard_runtime_minutes(input.plan, wildcards.shard, MODEL_SIZE.params, attempt)
    # before sharding, Snakemake evaluates it again once the plan exists
    return TBDString() if minutes is None else minutes


def io_runtime(wildcards, input, attempt):
    return io_runtime_minutes(input.size_mb, attempt)


# What the command does before, as and after its jobs run (esmshard.steps.start).
START = RunStart(
    invocation=INVOCATION,
    config=config,
    run=RUN,
    store=STORE,
    key=KEY,
    mutant_key=MUTANT_KEY if MUTANTS_WANTED else None,
    model_name=MODEL.name,
    model_params=MODEL.params,
    earlier=made_by_of(RUN.embeddings),
    log=logger,
    store_unwritable=STORE_UNWRITABLE,
    location=LOCATION,
)
try:
    START.begin()
except StartRefused as refused:
    stop(*refused.problems)


def hold_run_lock():
    try:
        START.hold_run_lock()
    except RunActiveError as err:
        raise WorkflowError(str(err))
