"""What the `snakemake` command reading the workflow is (a dry run, `--lint`, which executor,
a cluster job's own Snakemake), read once from Snakemake's parsed command line: while
Snakemake reads the workflow, its own `workflow.dryrun` is False under `-n` and
`workflow.local_exec` True under `--executor slurm` (both are set only when the jobs are
scheduled).
"""

import inspect
import os
from dataclasses import dataclass, field
from pathlib import Path

from ..install import CLONE, SHIPPED

# The executors that run jobs on this machine (`dryrun` and `touch` run none anywhere else).
LOCAL_EXECUTORS = ("local", "dryrun", "touch")
PLACEHOLDER = "CHANGE-ME"  # what the shipped cluster profiles hold until they are edited
# A cluster job's Snakemake is handed no value of the main process: the embed jobs that run
# at once go in the environment, which sbatch (and bsub) pass on.
CLUSTER_JOBS_ENV = "ESMSHARD_CLUSTER_JOBS"
# Set by `esmshard plan` (esmshard.commands.plan) to the executor of the run it plans, for the
# shard step it runs on this machine: the step plans that run's shards (how many jobs at once).
PLAN_ENV = "ESMSHARD_PLAN"
# The S3 plugin's settings that esmshard's own access to the store needs too.
S3_CREDENTIALS = {
    "access_key": "AWS_ACCESS_KEY_ID",
    "secret_key": "AWS_SECRET_ACCESS_KEY",
    "token": "AWS_SESSION_TOKEN",
    "region": "AWS_DEFAULT_REGION",
}


def placeholder_advice(profiles: tuple[str, ...]) -> str:
    """Say where to set a profile's placeholders: in a copy of one esmshard ships, so that its
    next update does not undo them, else in the user's own profile."""
    ours = {(root / "profiles").resolve() for root in (SHIPPED, CLONE)}
    shipped = [p for p in profiles if Path(p).resolve().parent in ours]
    if shipped:
        name = Path(shipped[0]).name
        return (
            f"copy the profile esmshard ships (cp -r {shipped[0]} my-{name}), set them in "
            f"my-{name}/config.yaml and run with --profile my-{name}"
        )
    where = " or ".join(f"{p}/config.yaml" for p in profiles) or "the profile"
    return f"set them in {where}"


class StartRefused(Exception):
    """The run cannot start: one line per problem, said before any job."""

    def __init__(self, *problems: str):
        super().__init__(*problems)
        self.problems = problems


@dataclass(frozen=True)
class Invocation:
    """What the `snakemake` command reading the workflow is."""

    dry_run: bool = False
    lint: bool = False
    executor: str = "local"
    remote_job: bool = False  # a cluster job's own Snakemake, reading the workflow again
    cores: int | None = None
    jobs: int | None = None  # --jobs (a cluster profile's `jobs`)
    gpu_resource: int | None = None  # --resources gpu=N
    placeholders: tuple[str, ...] = ()  # resources still holding PLACEHOLDER
    profiles: tuple[str, ...] = ()
    storage_provider: str | None = None  # --default-storage-provider: jobs share no filesystem
    storage_prefix: str | None = None  # --default-storage-prefix
    storage_endpoint: str | None = None  # --storage-s3-endpoint-url
    # --storage-s3-access-key, -secret-key, -token, -region (or their SNAKEMAKE_STORAGE_S3_*
    # variables, as a job gets them), by the name boto3 reads them from
    storage_credentials: dict = field(default_factory=dict, repr=False)

    @classmethod
    def of(cls, args, remote_job: bool = False) -> "Invocation":
        """From Snakemake's parsed command line `args` (a profile's values are in it); None
        where the workflow is read through Snakemake's Python API: a local run."""
        if args is None:
            return cls(remote_job=remote_job)
        given = list(getattr(args.default_resources, "args", None) or [])
        for resources in (args.set_resources or {}).values():
            given += getattr(resources, "args", None) or []
        # the executor's and the storage's settings (a cloud profile's queue, image, bucket)
        given += [
            f"{name}={untagged(value)}"
            for name, value in sorted(vars(args).items())
            if PLACEHOLDER in (untagged(value) or "")
        ]
        credentials = {
            variable: untagged(getattr(args, f"storage_s3_{name}", None))
            for name, variable in S3_CREDENTIALS.items()
        }
        return cls(
            dry_run=bool(args.dryrun),
            lint=bool(args.lint),
            # `esmshard plan` runs the shard step here for the run on the executor it names
            executor=os.environ.get(PLAN_ENV) or args.executor or "local",
            remote_job=remote_job,
            cores=args.cores,
            jobs=args.jobs,
            gpu_resource=getattr((args.resources or {}).get("gpu"), "value", None),
            placeholders=tuple(value for value in given if PLACEHOLDER in value),
            profiles=tuple(args.profile or ()),
            storage_provider=getattr(args, "default_storage_provider", None),
            storage_prefix=getattr(args, "default_storage_prefix", None),
            storage_endpoint=untagged(getattr(args, "storage_s3_endpoint_url", None)),
            storage_credentials={k: v for k, v in credentials.items() if v},
        )

    @property
    def starts_run(self) -> bool:
        """This command runs the jobs: not a dry run, `--lint`, nor a cluster job's Snakemake."""
        return not (self.dry_run or self.lint or self.remote_job)

    @property
    def jobs_here(self) -> bool:
        """The jobs run on this machine (a cluster job's on its node)."""
        return self.executor in LOCAL_EXECUTORS or self.remote_job


def untagged(value):
    """A storage plugin's setting as Snakemake parses it (a list of values, each for a tag: the
    first is the default provider's), or None where it is not given."""
    if isinstance(value, (list, tuple)):
        value = value[0] if value else None
    return value if isinstance(value, str) else None


def command_line():
    """Snakemake's parsed command line (`snakemake.cli.args_to_api`'s `args`), found on the
    stack of the call that reads the workflow; None where the workflow is read otherwise."""
    frame = inspect.currentframe()
    while frame is not None:
        code = frame.f_code
        if code.co_name == "args_to_api" and frame.f_globals.get("__name__") == "snakemake.cli":
            return frame.f_locals.get("args")
        frame = frame.f_back
    return None
