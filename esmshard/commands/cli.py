"""The `esmshard` console script."""

import argparse
import os
import sys
import time
from pathlib import Path

from ..embeddings_h5.representations import LAYERED
from ..files import DamagedFileError, given_path, is_object_url, quiet_hdf5_cleanup
from ..input.fasta import FastaError
from ..layout import Layout
from ..models import families_named
from ..outputs import export as exports
from ..steps.run_state import merged as status_merged
from ..steps.run_state import read_state
from ..store.objects import ObjectStoreError
from ..version import __version__
from . import console, launch
from .bucket_outdir import outdir_in_bucket
from .neighbours import add_neighbours_command, neighbours
from .status import render
from .store import show_store


def seconds(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text}: give a number of seconds greater than 0")
    return value


def cores(text: str) -> str:
    """`all`, or a whole number of cores of at least 1 (Snakemake waits for ever on 0)."""
    if text != "all" and not (text.isdigit() and int(text) >= 1):
        raise argparse.ArgumentTypeError(f"{text!r}: give a number of cores of at least 1, or all")
    return text


def profile_names() -> list[str]:
    """The profiles esmshard ships, for the help (none where its files are missing: `run`
    says so)."""
    try:
        return launch.shipped_profiles(launch.workflow_root())
    except launch.LaunchError:
        return []


def add_run_options(command) -> None:
    """What a run is: `esmshard run`'s and `esmshard plan`'s options."""
    command.add_argument(
        "inputs", nargs="*", metavar="FASTA", help="protein FASTA files (.gz, .bz2, .xz too)"
    )
    command.add_argument("-o", "--outdir", help="where the run's outputs go")
    command.add_argument(
        "--gpus",
        default="auto",
        help="CUDA device indices for the GPU pool, e.g. 0,1,2,3 (default auto: every visible "
        "device); sets --resources gpu=N",
    )
    command.add_argument(
        "--model",
        help=f"a model of {families_named()}: a fair-esm name (esm2_t33_650M_UR50D, the "
        "default, downloads its weights once), hf:OWNER/NAME (HuggingFace), a folder saved by "
        "transformers, a .pt or .pth checkpoint file, or random:NAME (seeded random weights of a "
        "published shape, e.g. random:esm2_t6_8M_UR50D: runs offline, for trying esmshard out)",
    )
    command.add_argument(
        "--profile",
        help=f"a cluster profile esmshard ships ({', '.join(profile_names())}) or a profile "
        "folder of your own",
    )
    command.add_argument(
        "--cores", type=cores, default="all", help="CPU cores Snakemake may use (default all)"
    )
    command.add_argument(
        "--config",
        nargs="+",
        action="extend",
        default=[],
        metavar="KEY=VALUE",
        help="config keys, as after snakemake's --config, e.g. 'repr_layers=[-1,6]' (input, "
        "outdir, gpus and model too, the same as their options)",
    )


def build_parser() -> argparse.ArgumentParser:
    """Build the parser of every esmshard command."""
    parser = argparse.ArgumentParser(
        prog="esmshard",
        description=f"esmshard: protein language model embeddings ({families_named()}) on "
        "every GPU, as a Snakemake workflow",
    )
    parser.add_argument("--version", action="version", version=f"esmshard {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    add_run_commands(commands)
    add_status_command(commands)
    add_store_command(commands)
    add_export_command(commands)
    add_neighbours_command(commands)
    add_variant_commands(commands)
    add_setup_commands(commands)
    return parser


def add_run_commands(commands) -> None:
    """Add `esmshard run` and `esmshard plan`."""
    run = commands.add_parser(
        "run",
        help="run the workflow on FASTA files from any folder (prints the snakemake command)",
        description="Run esmshard's workflow with Snakemake in the current folder. The "
        "`snakemake` command it builds is printed first; anything after `--` is passed on to "
        "it, e.g. `esmshard run proteins.fasta -o out -- --dry-run`.",
    )
    add_run_options(run)
    run.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="show Snakemake's own output (without it, esmshard's lines and a progress display; "
        "the whole output goes to OUTDIR/logs/esmshard-run.log); so do Snakemake options "
        "after `--`",
    )
    run.add_argument(
        "--progress-every",
        type=seconds,
        default=console.LOG_EVERY_SECONDS,
        metavar="SECONDS",
        help="where the output is not a terminal (a file, a pipe, a cluster job's output): "
        "seconds between progress lines, beside the one at each shard's end "
        f"(default {console.LOG_EVERY_SECONDS:.0f})",
    )
    plan = commands.add_parser(
        "plan",
        help="plan a run here and show the jobs it will submit, with what each asks for",
        description="Read the inputs and plan the shards as the run will (the plan is kept in "
        "OUTDIR: the run then uses it), then show the jobs that `esmshard run` with the same "
        "arguments submits: with a SLURM profile, each one's sbatch options; the GPU-hours "
        "and the disk the outputs need. Nothing is submitted.",
    )
    add_run_options(plan)


def add_status_command(commands) -> None:
    """Add `esmshard status`."""
    status = commands.add_parser(
        "status", help="dashboard of a run: per device slot, progress, ETA"
    )
    status.add_argument(
        "outdir",
        type=given_path,
        help="the run's outdir (as in the config), or its s3:// URL for a run in object storage",
    )
    status.add_argument(
        "--watch",
        nargs="?",
        const=5.0,
        type=seconds,
        metavar="SECONDS",
        help="refresh every SECONDS (default 5) until the run has finished (or Ctrl-C)",
    )


def add_store_command(commands) -> None:
    """Add `esmshard store`."""
    store = commands.add_parser(
        "store",
        help="what a store of computed embeddings holds; verify it, prune it, remove a setting's "
        "entries",
        description="List what a store holds (per settings key: sequences, parts, bytes). "
        "--remove and --prune refuse, naming the runs, while a run uses the key they change.",
    )
    store.add_argument(
        "path",
        type=given_path,
        help="a store, or a run's outdir (its store is used): a folder, or an s3:// URL",
    )
    action = store.add_mutually_exclusive_group()
    action.add_argument(
        "--remove", metavar="KEY", help="remove every entry computed with the settings KEY"
    )
    action.add_argument(
        "--verify",
        action="store_true",
        help="check every part against its manifest and set damaged ones aside; exit status 1 "
        "if any were found",
    )
    action.add_argument(
        "--prune",
        action="store_true",
        help="list the parts that no outdir named by --keep uses, and parts set aside, with the "
        "bytes each would free; with --apply, remove them",
    )
    store.add_argument(
        "--keep",
        nargs="+",
        type=Path,
        default=[],
        metavar="OUTDIR",
        help="--prune: outdirs to keep",
    )
    store.add_argument("--apply", action="store_true", help="--prune: remove what it lists")


def add_export_command(commands) -> None:
    """Add `esmshard export`."""
    export = commands.add_parser(
        "export",
        help="a run's embeddings in the layout another tool reads",
        description="Write a finished run's embeddings.h5 as per-protein-h5 (biotrainer, "
        "bio_embeddings), pt (fair-esm extract's files), npy (numpy arrays, ids.tsv), parquet "
        "(a folder of Parquet files: pyarrow, DuckDB, polars, pandas, Spark), biotrainer (a folder to train on), h5 (embeddings.h5 "
        "with every value in the file) or h5ad (AnnData, scanpy: per-protein values in obsm); streamed, with a progress bar. An option that the "
        "format does not read is refused.",
    )
    export.add_argument("outdir", type=Path, help="the run's outdir (as in the config)")
    export.add_argument("--format", required=True, choices=sorted(exports.FORMATS))
    export.add_argument(
        "--out",
        required=True,
        type=Path,
        help="the file (or folder for "
        + ", ".join(name for name, f in exports.FORMATS.items() if f.folder)
        + ") to write",
    )
    export.add_argument(
        "--kind",
        choices=sorted(LAYERED),
        help="per-protein-h5: the representation written (default mean, if the run has it)",
    )
    export.add_argument(
        "--layer",
        type=int,
        help="per-protein-h5 and biotrainer: the layer written (default the highest; -1 is the "
        "model's last)",
    )
    export.add_argument(
        "--key",
        choices=["hash", "id"],
        help="per-protein-h5: datasets named by biotrainer's sequence hash (default) or by ID",
    )
    export.add_argument(
        "--names",
        choices=["id", "header"],
        help="pt: files named by escaped ID (default) or by the full FASTA header, as fair-esm's "
        "extract.py names them ({header}.pt)",
    )


def add_variant_commands(commands) -> None:
    """Add `esmshard ensemble` and `esmshard heatmap`."""
    ensemble = commands.add_parser(
        "ensemble",
        help="average the variant scores of several runs (an ensemble, as ESM-1v's five)",
        description="Write the mean of each strategy's variant scores over the runs in OUTDIR "
        "(each run's variant_scores.tsv, one run per model over the same variants table).",
    )
    ensemble.add_argument("outdirs", nargs="+", type=Path, metavar="OUTDIR", help="the runs")
    ensemble.add_argument("--out", required=True, type=Path, help="the TSV to write")
    heatmap = commands.add_parser(
        "heatmap",
        help="draw a protein's substitution scores (position × 20 amino acids) as a PNG or SVG",
        description="Draw each position's log p(amino acid) − log p(wild type) of protein ID "
        "in the run in OUTDIR, as the esm-variants portal shows them: a diverging scale centred "
        "on 0, the wild type black, long proteins in numbered rows of 250 positions.",
    )
    heatmap.add_argument("outdir", type=Path, help="the run's outdir")
    heatmap.add_argument("id", help="the protein's ID, as in the input")
    heatmap.add_argument("-o", "--out", required=True, type=Path, help="FILE.png or FILE.svg")
    heatmap.add_argument(
        "--scores",
        choices=["logits", "masked_marginals"],
        help="which log-probabilities: logits (wt_marginals) or masked_marginals; default: the "
        "first of them the run has",
    )


def add_setup_commands(commands) -> None:
    """Add `esmshard deploy` and `esmshard gpu-check`."""
    deploy = commands.add_parser(
        "deploy",
        help="deploy the workflow from a local clone, as the workflow catalog does",
        description="Write the workflow catalog's layout (workflow/Snakefile using the clone's "
        "rules as a module, config/ and profiles/ to edit) into FOLDER; `snakedeploy "
        "deploy-workflow` does the same for a hosted repository. Then, in FOLDER: `snakemake "
        "--cores all --resources gpu=N`.",
    )
    deploy.add_argument("clone", type=Path, help="a clone of esmshard")
    deploy.add_argument("folder", type=Path, help="where the deployment goes")
    deploy.add_argument(
        "--tag",
        help="the release to deploy (vX.Y.Z, made by `make release`); default: the "
        "clone's files as they are",
    )
    gpu_check = commands.add_parser(
        "gpu-check",
        help="prove a GPU machine: GPU tests, a whole run, the throughput benchmark (in a clone)",
    )
    gpu_check.add_argument(
        "--out", type=Path, default=Path("gpu-check"), help="where gpu-check.json and .md go"
    )
    gpu_check.add_argument(
        "--stages", nargs="+", metavar="STAGE",
        help="these stages only (default: all; python -m esmshard.commands.gpucheck --help "
        "lists them)",
    )  # fmt: skip


def main(argv=None):
    """Run the esmshard command that `argv` names, and return its exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    # `esmshard run ... -- SNAKEMAKE OPTIONS`: what follows `--` goes to snakemake as it is.
    passed_on = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    parser = build_parser()
    args = parser.parse_args(argv)
    if passed_on and args.command != "run":
        parser.error("options after `--` go with `esmshard run` only")
    if args.command in ("run", "plan"):
        return run_or_plan(parser, args, passed_on)
    return HANDLERS[args.command](parser, args)


def run_or_plan(parser, args, passed_on: list[str]) -> int:
    """Run the workflow, or plan it (`esmshard plan`)."""
    # Options in any order: FASTA files typed after --config's KEY=VALUE items are inputs.
    args.inputs += [item for item in args.config if "=" not in item]
    asked = launch.Launch(
        inputs=args.inputs,
        outdir=args.outdir,
        gpus=args.gpus,
        model=args.model,
        profile=args.profile,
        cores=args.cores,
        config=[item for item in args.config if "=" in item],
        snakemake_args=passed_on,
        verbose=getattr(args, "verbose", False),
        progress_every=getattr(args, "progress_every", None),
    )
    try:
        if args.command == "plan":
            from .plan import plan

            return plan(asked)
        return launch.run(asked)
    except launch.LaunchError as err:
        parser.exit(2, f"esmshard {args.command}: {err}\n")


def deploy(parser, args) -> int:
    """Write the workflow catalog's layout of a clone (`esmshard deploy`)."""
    from .deploy import DeployError
    from .deploy import deploy as deploy_clone

    try:
        deployed = deploy_clone(args.clone, args.folder, args.tag)
    except DeployError as err:
        parser.exit(1, f"esmshard deploy: {err}\n")
    for yours, new in deployed.kept:
        print(f"esmshard deploy: kept your {yours}; esmshard's is beside it: {new}")
    print(f"esmshard deploy: wrote {deployed.snakefile}; edit {args.folder}/config/config.yaml")
    return 0


def gpu_check(parser, args) -> int:
    """Prove a GPU machine (`esmshard gpu-check`)."""
    from .gpucheck import main as gpu_check_main

    stages = ["--stages", *args.stages] if args.stages else []
    return gpu_check_main(["--out", str(args.out), *stages])


def store(parser, args) -> int:
    """List, verify, prune or remove a store's entries (`esmshard store`)."""
    if (args.keep or args.apply) and not args.prune:
        parser.error("--keep and --apply go with --prune")
    if args.prune and not args.keep:
        parser.error("--prune needs --keep OUTDIR...: the outdirs whose parts stay")
    return show_store(parser, args)


def heatmap(parser, args) -> int:
    """Draw a protein's substitution scores (`esmshard heatmap`)."""
    from ..outputs.heatmap import HeatmapError
    from ..outputs.heatmap import heatmap as draw_heatmap

    try:
        print(draw_heatmap(args.outdir, args.id, args.out, args.scores).line)
    except (HeatmapError, DamagedFileError, FastaError, OSError) as err:
        parser.exit(1, f"esmshard heatmap: {err}\n")
    return 0


def ensemble(parser, args) -> int:
    """Average several runs' variant scores (`esmshard ensemble`)."""
    return average_variant_scores(parser, args.outdirs, args.out)


def export(parser, args) -> int:
    """Write a run's embeddings in another tool's layout (`esmshard export`)."""
    quiet_hdf5_cleanup()  # a failed write is reported below, in one line
    existed = os.path.lexists(args.out)  # an export refuses to write over it
    stop = exports.Stop()
    try:
        with exports.stoppable(stop):
            exports.export(
                args.outdir, args.format, args.out, kind=args.kind, layer=args.layer,
                key=args.key, names=args.names,
            )  # fmt: skip
    except (exports.ExportError, DamagedFileError, KeyError, FastaError) as err:
        parser.exit(1, f"esmshard export: {err.args[0]}\n")
    except OSError as err:  # a full disk (DiskFullError), an unreadable file: one line
        export_ends(f"esmshard export: {err}", 1)
    except KeyboardInterrupt:
        signum = stop.signal
        if not existed and os.path.lexists(args.out):  # it landed once the export was in place
            export_ends(f"wrote {args.out}; then stopped by {signum.name}", 128 + signum)
        export_ends(
            f"esmshard export: stopped by {signum.name}; nothing was written to "
            f"{args.out} (its partial files are removed): run the same command again",
            128 + signum,
        )
    print(f"wrote {args.out}")
    return 0


def status(parser, args) -> int:
    """Show a run's dashboard, once or until it has finished (`esmshard status`)."""
    if not is_object_url(args.outdir) and not args.outdir.is_dir():
        what = "is a file" if args.outdir.exists() else "does not exist"
        parser.error(f"{args.outdir} {what}; give the `outdir` folder of a run")
    try:
        if not args.watch:
            state, _ = run_state(args.outdir)
            print(render(state))
            return 0 if (state["planned"] or state["started"]) and not state.get("damaged") else 1
        while True:  # Ctrl-C is how one leaves the watch, whenever it comes
            state, done = run_state(args.outdir)
            sys.stdout.write("\033[H\033[J" + render(state) + "\n")
            sys.stdout.flush()
            if done:
                return 0
            time.sleep(args.watch)
    except KeyboardInterrupt:
        return 0
    except ObjectStoreError as err:
        parser.exit(1, f"esmshard status: {err}\n")


def run_state(outdir) -> tuple[dict, bool]:
    """The run's state in `outdir` (a folder, or a URL in object storage), and whether it has
    finished."""
    if is_object_url(outdir):
        with outdir_in_bucket(outdir) as copy:
            state, done = run_state(copy)
        return {**state, "outdir": outdir}, done
    state = read_state(outdir)
    return state, merged(outdir, state)


HANDLERS = {
    "deploy": deploy,
    "gpu-check": gpu_check,
    "store": store,
    "heatmap": heatmap,
    "ensemble": ensemble,
    "export": export,
    "neighbours": neighbours,
    "status": status,
}


def export_ends(line: str, status: int):
    """The export's one line, then straight out: after a failed or stopped write, HDF5's
    clean-up at exit can crash the process."""
    sys.stderr.write(line + "\n")
    sys.stderr.flush()
    os._exit(status)


def average_variant_scores(parser, outdirs, out: Path) -> int:
    from ..outputs.variant_average import average_scores

    tables = [Path(Layout(str(outdir)).variant_scores) for outdir in outdirs]
    missing = [str(t) for t in tables if not t.is_file()]
    if missing:
        parser.exit(1, f"esmshard ensemble: {', '.join(missing)} does not exist: give the outdirs "
                       "of finished runs with `variants` set\n")  # fmt: skip
    if out.exists():
        parser.exit(1, f"esmshard ensemble: {out} exists; remove it or choose another --out\n")
    try:
        rows = average_scores([str(t) for t in tables], out)
    except (ValueError, OSError) as err:
        parser.exit(1, f"esmshard ensemble: {err}\n")
    print(f"wrote {out}: {rows:,} variants, the mean of {len(tables)} runs")
    return 0


def merged(outdir: Path, state: dict) -> bool:
    """Whether the run has finished: every shard of its plan done, and merged since it was planned."""
    return bool(state.get("complete")) and status_merged(Layout(str(outdir)))
