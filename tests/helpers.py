"""What the tests share besides fixtures: the real data (read where it lies, subsets made at run
time), `snakemake` runs, model checkpoints and the checks of what a run left."""

import atexit
import contextlib
import errno
import http.client
import http.server
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import h5py
import numpy as np
import pytest
import yaml

from esmshard.input.datasets import DatasetError, fetch_test_data
from esmshard.input.sizing import ModelSize
from esmshard.outputs.reader import Embeddings
from esmshard.steps.shard import write_shards
from esmshard.store import Store, add_settings, settings_key, write_manifest
from esmshard.store.shardfile import ShardWriter

REPO = Path(__file__).resolve().parents[1]
TINY_MODEL = "esm2_t6_8M_UR50D"

# Third-party files: read in ../shared/data, or fetched once into resources/test-data.
try:
    DATA = fetch_test_data(REPO / "resources" / "test-data")
except DatasetError as err:
    pytest.exit(f"the test data is missing and cannot be fetched: {err}", returncode=3)
PROTEOME = DATA / "ecoli_k12_UP000000625.fasta"
LONG_PROTEIN = DATA / "r1ab_sars2.fasta"  # 7,096 residues
GENE_CALLER = DATA / "dram_camper_test_genes.faa"  # terminal '*'
ALIGNED = DATA / "biopython_fa01_aligned.fasta"
NUCLEOTIDE = DATA / "yersinia_pestis_pMT1_NC_005816_genes.ffn"

# Put before a docs snippet run with this Python: what only the test extras install (scipy,
# through them) cannot be imported, as in the venv `make run` builds for users.
WITHOUT_TEST_EXTRAS = "import sys; sys.modules.update(dict.fromkeys(['scipy', 'sklearn']))\n"

SUBSETS = Path(tempfile.mkdtemp(prefix="esmshard-test-data-"))
atexit.register(shutil.rmtree, SUBSETS, ignore_errors=True)

# esmshard's cache (weights found to fit, checksums of read-only outdirs) in a folder of the
# suite's, for every process it starts: a developer's ~/.cache gains nothing. pip's and
# matplotlib's caches stay where they were (warm, they keep the install tests and plots fast).
_USER_CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
os.environ.setdefault("PIP_CACHE_DIR", str(_USER_CACHE / "pip"))
os.environ.setdefault("MPLCONFIGDIR", str(_USER_CACHE / "matplotlib"))
os.environ["XDG_CACHE_HOME"] = str(SUBSETS / "cache")


def read_records(path: Path) -> list[tuple[str, str]]:
    """(header line, sequence) of each record of a plain FASTA file, as written."""
    records = []
    for line in path.read_text().splitlines():
        if line.startswith(">"):
            records.append([line, ""])
        else:
            records[-1][1] += line.strip()
    return [tuple(r) for r in records]


def write_subset(name: str, keep) -> Path:
    """The proteome's records i for which keep(i, header, sequence) holds, byte for byte, in a temporary folder."""
    records = read_records(PROTEOME)
    chosen = [i for i, (header, seq) in enumerate(records) if keep(i, header, seq)]
    lines, index = [], -1
    for line in PROTEOME.read_text().splitlines(keepends=True):
        index += line.startswith(">")
        if index in chosen:
            lines.append(line)
    path = SUBSETS / name
    path.write_text("".join(lines))
    return path


_LONG = [i for i, (_, seq) in enumerate(read_records(PROTEOME)) if len(seq) > 1022][:3]
# Every 120th record of the proteome plus its first three longer than 1022 residues: 40 proteins.
PROTEINS = write_subset("ecoli_k12_40.fasta", lambda i, h, s: i % 120 == 0 or i in _LONG)
# Pseudogenes with in-frame stops (X) and a selenocysteine (U).
NONSTANDARD = write_subset(
    "ecoli_nonstandard.fasta",
    lambda i, h, s: any(f"|{n}_ECOLI " in h for n in ("YBFI", "YBFG", "FDHF")),
)


# The store's runs (tests/store, tests/steps/test_provenance). Run A: every second record of a slice of the real proteome. Run B: A's records, 10% new
# records, and 5% of A's sequences again under new IDs.
SLICE = [r for i, r in enumerate(read_records(PROTEOME)) if i % 16 == 0][:240]
A = SLICE[0::2]
NEW = SLICE[1::2][: len(A) // 10]
COPIES = [(f">again{k} {h[1:]}", s) for k, (h, s) in enumerate(A[: len(A) // 20])]
B = A + NEW + COPIES


def seeded_esm2(layers: int, dim: int, seed: int = 0):
    """fair-esm's ESM-2 of `layers` layers and width `dim` (4 heads) with random weights of
    `seed`, in eval mode; the caller's random state is left as it was."""
    import torch
    from esm.model.esm2 import ESM2

    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return ESM2(num_layers=layers, embed_dim=dim, attention_heads=4, alphabet="ESM-1b").eval()


def seeded_esmc(arch, seed: int = 0):
    """esmshard's ESM C of shape `arch` (esmshard.models.spec.Arch) with random weights of
    `seed`, in eval mode; the caller's random state is left as it was."""
    import torch

    from esmshard.models.esmc import ESMC
    from esmshard.models.esmc_weights import Shape, ffn_size

    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return ESMC(Shape(arch, ffn_size(arch.dim))).eval()


def micro_checkpoint(folder: Path, seed: int = 0) -> Path:
    """A micro ESM-2 (6 layers, so every layer number of esm2_t6 is one; D = 32) with random
    weights of `seed` in fair-esm's on-disk format: for the tests of the data path, where the
    model's arithmetic is not what is tested (the parity tests use the real shapes)."""
    from esmshard.models.esm2 import write_checkpoint

    return write_checkpoint(seeded_esm2(6, 32, seed), folder, "esm2_t6_micro")


MODEL = str(micro_checkpoint(SUBSETS / "micro"))
# Another model as cheap: where a run of other settings, or another model's part, is the claim.
OTHER_MODEL = str(micro_checkpoint(SUBSETS / "other-micro", seed=1))


def hub_cache(root, repo, folder):
    """`folder` as the HuggingFace cache holds a download of `repo` (HF_HUB_CACHE=`root`)."""
    snapshot = root / f"models--{repo.replace('/', '--')}" / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    for path in folder.iterdir():  # links, as the cache's snapshots link to its blobs
        (snapshot / path.name).symlink_to(path)
    (root / f"models--{repo.replace('/', '--')}" / "refs").mkdir()
    (root / f"models--{repo.replace('/', '--')}" / "refs" / "main").write_text("0" * 40)
    return root


def hidden_states_alone(model, ids, attended, **inputs) -> tuple:
    """A transformers `model`'s hidden states of the padded batch `ids`, each row run alone on
    its `attended` tokens (a padded batch costs the longest row's length for every row), zero
    past them: one (rows, tokens, width) tensor per layer."""
    import torch

    with torch.inference_mode():
        outs = [model(input_ids=ids[row, attended[row]][None], output_hidden_states=True, **inputs)
                for row in range(len(ids))]  # fmt: skip
    hidden = tuple(torch.zeros(*ids.shape, h.shape[-1]) for h in outs[0].hidden_states)
    for row, out in enumerate(outs):
        assert torch.equal(out.hidden_states[-1], out.last_hidden_state)  # after the final norm
        for layer, h in zip(hidden, out.hidden_states):
            layer[row, attended[row]] = h[0]
    return hidden


def fasta(path, records):
    path.write_text("".join(f"{h}\n{s}\n" for h, s in records))
    return path


def config(input_path, outdir, *more):
    """`--config` overrides as a user types them."""
    return ["--config", f"input={input_path}", f"outdir={outdir}", f"model={MODEL}", *more]


def run_json(outdir):
    return json.loads((outdir / "run.json").read_text())


def tracked_files() -> list[str]:
    """The repository's tracked files, by path."""
    files = subprocess.run(
        ["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True
    ).stdout.split(b"\0")
    return [name.decode() for name in files if name]


def clone_of_workflow(folder: Path) -> Path:
    """A copy of the repository's tracked files, as a fresh clone has them (no example input,
    no virtualenv, no results)."""
    for name in tracked_files():
        source = REPO / name
        if source.is_file():
            target = folder / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    return folder


def doc_block(page: str, after: str, fence: str = "```\n") -> str:
    """The first code block opened by `fence` after the text `after` in a page of the docs
    (README.md, docs/...): the tests run the commands as the docs show them."""
    text = (REPO / page).read_text()
    start = text.index(fence, text.index(after)) + len(fence)
    return text[start : text.index("```", start)]


def snakemake_command(workdir: Path, config: dict, *args, env: dict | None = None):
    """The `snakemake` command line and environment of a run in `workdir` (the profile applies)."""
    workdir.mkdir(parents=True, exist_ok=True)
    cfg = workdir / "config.yaml"
    cfg.write_text(yaml.safe_dump(config))
    full_env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "ESMSHARD_POOL_DIR": str(workdir / "gpu-pool"),
        **(env or {}),
    }
    full_env = {k: v for k, v in full_env.items() if v is not None}  # None: unset it
    cmd = [
        "snakemake",
        "-s",
        str(REPO / "Snakefile"),
        "-d",
        str(workdir),
        *args,  # first: a target in them is not taken for a value of the options below
        "--configfile",
        str(cfg),
        "--cores",
        "8",
        "--set-threads",
        "embed=1",
    ]
    return cmd, full_env


def snakemake(workdir: Path, config: dict, *args, env: dict | None = None, check: bool = True):
    """Run the workflow through the `snakemake` command line, as users do."""
    cmd, full_env = snakemake_command(workdir, config, *args, env=env)
    result = subprocess.run(cmd, cwd=REPO, env=full_env, capture_output=True, text=True)
    if check and result.returncode != 0:
        raise AssertionError(
            f"snakemake failed ({result.returncode}):\n{result.stdout}\n{result.stderr}"
        )
    return result


def kill_9_when(cmd, env, ready, timeout: float = 300) -> None:
    """Start a run in its own process group and kill -9 it once `ready()` is true."""
    run = subprocess.Popen(
        cmd,
        cwd=REPO,
        env=env,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.time() + timeout
    while not ready():
        assert run.poll() is None and time.time() < deadline, (
            "the run ended before it could be killed"
        )
        time.sleep(0.02)
    os.killpg(run.pid, signal.SIGKILL)
    run.wait()


def kill_9_after_shards(cmd, env, store_root: Path, n_shards: int, timeout: float = 300) -> None:
    """kill -9 a run once `n_shards` shards are finished: their parts are in the store (renamed
    into place after the job's other outputs)."""
    store = Store(str(store_root))

    def finished() -> int:
        return sum(len(store.parts(key)) for key in store.settings_keys())

    kill_9_when(cmd, env, lambda: finished() >= n_shards, timeout)


def progress_of(outdir: Path) -> dict:
    """The one embed job's progress file, as `esmshard status` reads it; {} while there is none
    (or it is being replaced)."""
    try:
        (path,) = (outdir / "progress").glob("*.json")
        return json.loads(path.read_text())
    except (ValueError, OSError):
        return {}


def jobs_run(result) -> dict[str, int]:
    """The jobs a run executed (or, with -n, would execute): rule -> number of jobs.

    Counted from each job's header; the "Job stats" table cannot say it, as the embed jobs are
    known only after the shard step (a checkpoint)."""
    text = result.stdout + result.stderr
    return dict(
        Counter(
            m.group(1)
            for m in re.finditer(r"^(?:local)?(?:rule|checkpoint) (\w+):$", text, re.M)
            if m.group(1) != "all"
        )
    )


def fair_esm_model(checkpoint: Path):
    """fair-esm's model (eval mode) and alphabet from a checkpoint file and its contact
    regression, by fair-esm's own loader: the reference the tests compare with."""
    import argparse

    import torch
    from esm.pretrained import load_model_and_alphabet_core

    with torch.serialization.safe_globals([argparse.Namespace]):
        data = torch.load(checkpoint, weights_only=True)
        regression = torch.load(
            str(checkpoint).replace(".pt", "-contact-regression.pt"), weights_only=True
        )
    net, alphabet = load_model_and_alphabet_core(Path(checkpoint).stem, data, regression)
    return net.eval(), alphabet


@contextlib.contextmanager
def small_disk(folder: Path, megabytes: int):
    """A real filesystem of `megabytes` (a tmpfs) at `folder`, for a disk that fills up."""
    folder.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={megabytes}m", "tmpfs", str(folder)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (it needs root): {mounted.stderr.strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=True)


@contextlib.contextmanager
def read_only(folder: Path):
    """`folder` on a read-only mount (a bind mount of itself) inside the block: EROFS for every
    writer, root included, as a read-only share or a snapshot gives."""
    bound = subprocess.run(["mount", "--bind", folder, folder], capture_output=True, text=True)
    if bound.returncode != 0:
        pytest.skip(f"cannot bind-mount here (it needs root): {bound.stderr.strip()}")
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", folder], check=True)
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=True)


def fill(disk: Path, leave_bytes: int) -> None:
    """Write a filler file until `leave_bytes` are free, or the disk is full (others write too)."""
    with open(disk / "filler", "ab", buffering=0) as fh:
        try:
            while (free := shutil.disk_usage(disk).free) > leave_bytes:
                fh.write(b"\0" * min(free - leave_bytes, 1 << 20))
        except OSError as err:
            if err.errno != errno.ENOSPC:
                raise


# The embedding settings of the shard step's tests (no model is run).
SHARD_SETTINGS = {"model": "random:esm2_t6_8M_UR50D", "repr_layers": [-1]}


def plan_shards(inputs, shard_dir, n_shards, limit=1022, store=None, **options):
    """write_shards with a store (by default its own) and a checksum cache beside `shard_dir`."""
    store = store or shard_dir.with_name(f"{shard_dir.name}-store")
    cache = shard_dir.with_name(f"{shard_dir.name}-checksums.json")
    return write_shards(
        inputs,
        shard_dir,
        n_shards,
        limit,
        ModelSize(12 * 6 * 320**2, 320),
        store,
        SHARD_SETTINGS,
        cache,
        **options,
    )


def every_value(path) -> dict:
    """Every value the reader gives of an embeddings.h5: each layer whole, in batches, and
    protein by protein (the last with its ID)."""
    found = {}
    with Embeddings(path) as emb:
        found["ids"] = emb.ids()
        for kind, layers in emb.layers.items():
            for layer in layers:
                found[kind, layer] = emb.array(kind, layer)
                batches = [b.values for b in emb.batches(kind, layer, size=7)]
                found[kind, layer, "batches"] = np.concatenate(batches)
                found[kind, layer, "last"] = emb.values(found["ids"][-1], kind, layer)
                found[kind, layer, "each"] = [emb.values(i, kind, -1) for i in range(len(emb))]
        for kind in emb.unlayered:  # contact maps, scores
            found[kind] = emb.array(kind)
            found[kind, "batches"] = np.concatenate([b.values for b in emb.batches(kind, size=7)])
            found[kind, "each"] = [emb.values(i, kind) for i in range(len(emb))]
    return found


def assert_same_values(copied: dict, in_place: dict) -> None:
    assert copied.keys() == in_place.keys()
    for name, value in copied.items():
        if name == "ids":
            assert value == in_place[name]
            continue
        for a, b in zip(*(v if isinstance(v, list) else [v] for v in (value, in_place[name]))):
            assert a.dtype == b.dtype and np.array_equal(a, b), name


def write_part(store_root, settings, name, keys, ids, reps, failed=(), include=("mean",)) -> Path:
    """A store part as an embed job leaves it (esmshard.store): `reps` (one {layer:
    Representation} per sequence, in the order written), `failed` (esmshard.store.shardfile.Failure,
    by position in `keys`) and its manifest."""
    store, key = Store(str(store_root)), settings_key(settings)
    path = Path(store.part(key, name))
    path.parent.mkdir(parents=True, exist_ok=True)
    add_settings(store, key, settings)
    tmp = path.with_name(f".{path.name}.tmp")
    done = [k for k in range(len(keys)) if k not in {f.index for f in failed}]
    layers = sorted(reps[0]) if reps else [6]
    dim = next(iter(reps[0].values())).bos.size if reps else 4
    with h5py.File(tmp, "w") as h5:
        writer = ShardWriter(h5, layers, list(include), dim)
        if done:
            writer.write([keys[k] for k in done], [ids[k] for k in done], reps)
        writer.write_failed(list(failed), keys, ids)
        h5.attrs.update(
            shard=name,
            model=settings["model"],
            weights="random",
            precision="fp32",
            truncation_seq_length=1022,
            settings=json.dumps(settings),
        )
    write_manifest(store.manifest(key, name), tmp, len(done))
    os.replace(tmp, path)
    return path


def leftovers(*folders: Path) -> list[str]:
    """Temporary files and folders of any writer, and store manifests without their part."""
    found = []
    for folder in folders:
        found += [str(p) for p in folder.rglob("*.tmp")]
        found += [
            str(p)
            for p in folder.rglob("*.json")
            if (p.parent / "settings.json").is_file()
            and p.name != "settings.json"
            and not p.with_suffix(".h5").exists()
        ]
    return sorted(set(found))


def planned_parts(outdir: Path) -> dict[str, Path]:
    """The shards of a run's plan, each with its part in the store (the default store)."""
    plan = json.loads((outdir / "shards" / "plan.json").read_text())
    store = Store(str(outdir / "store"))
    rows = (outdir / "shards" / "plan.tsv").read_text().splitlines()[1:]
    names = [row.split("\t")[0] for row in rows]
    return {name: Path(store.part(plan["key"], name)) for name in names}


def run_lock_holder(lock) -> subprocess.Popen:
    """Another process that takes an outdir's run lock and keeps it until killed."""
    proc = subprocess.Popen(
        [sys.executable, "-c",
         f"import time; from esmshard.store import runlock; runlock.hold({str(lock)!r}, 'results')\n"
         "print('held', flush=True); time.sleep(120)"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdout.readline().strip() == "held"
    return proc


def refused_before_any_job(result) -> str:
    """The one line of esmshard's that refused a run before any job, with no stack lines."""
    assert result.returncode != 0 and jobs_run(result) == {}, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    (line,) = [ln for ln in result.stderr.splitlines() if ln.startswith("esmshard:")]
    return line


CONFIG_SCHEMA = yaml.safe_load((REPO / "workflow" / "schemas" / "config.schema.yaml").read_text())


def snakemake_config(config: dict, values: list[str]) -> dict:
    """The config as Snakemake builds it for the Snakefile: the schema's defaults, the workflow's
    config/config.yaml, then `config` (a run's config file), then the `--config` values, parsed
    by Snakemake's own parser."""
    from snakemake.cli import parse_config

    from esmshard.steps.checks import defaults

    own = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    return {**defaults(CONFIG_SCHEMA), **own, **config, **parse_config(values)}


def config_check(workdir: Path, config: dict, *typed: str) -> list[str]:
    """The lines (`esmshard: ...`) that the Snakefile's config check would stop a run of `config`
    and the command-line words `typed` with, found in this process: the config as Snakemake
    builds it (snakemake_config, `config` as the run's config file), checked by what common.smk
    calls, in `workdir` (snakemake -d)."""
    from esmshard.steps.checks import check_config

    words = list(typed[typed.index("--config") + 1 :]) if "--config" in typed else []
    values = words[: next((k for k, w in enumerate(words) if w.startswith("-")), len(words))]
    merged = snakemake_config(config, values)
    workdir.mkdir(parents=True, exist_ok=True)
    with contextlib.chdir(workdir):
        checked = check_config(merged, CONFIG_SCHEMA, inputs=True)
    return [f"esmshard: {problem}" for problem in checked.problems]


@contextlib.contextmanager
def environment(env: dict):
    """This process's environment replaced by `env` (a command's, as `subprocess.run` takes it)
    while the block runs."""
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def object_run_check(cmd: list[str], env: dict) -> list[str]:
    """The lines (`esmshard: ...`) that the Snakefile's object-storage check would stop the
    `snakemake` command `cmd` with in the environment `env`, found in this process: the command
    line parsed by Snakemake's own parser, the config as Snakemake builds it, the run's
    location and inputs checked by what common.smk calls."""
    from snakemake.cli import parse_args

    from esmshard.steps.checks import check_config
    from esmshard.steps.invocation import Invocation
    from esmshard.steps.object_run import check_object_run
    from esmshard.store.location import Location

    _, args = parse_args(cmd[1:])
    invocation = Invocation.of(args)
    merged = snakemake_config({}, args.config or [])
    location = Location.of_run(invocation, merged)
    config = check_config(merged, CONFIG_SCHEMA, inputs=False).config
    with environment({**env, **invocation.storage_credentials}):
        checked = check_object_run(location, config["input"])
    return [f"esmshard: {problem}" for problem in checked.problems]


def the_one_refusal(lines: list[str]) -> str:
    """The one line of a refusal (`config_check`'s), as `refused_before_any_job` reads a run's."""
    assert len(lines) == 1, lines
    return lines[0]


def free_port() -> int:
    """A TCP port of the loopback that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


S3_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test"}
# What a run against moto's server needs in its environment (no instance metadata to ask).
S3_ENV = {**S3_CREDENTIALS, "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"}


@contextlib.contextmanager
def moto_server(env: dict | None = None):
    """moto's S3 server on a port of the loopback, for the duration: its port."""
    port = free_port()
    moto = Path(sys.executable).with_name("moto_server")
    server = subprocess.Popen(
        [str(moto), "-H", "127.0.0.1", "-p", str(port)],
        env={**os.environ, **(env or {})},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(400):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.05)
        yield port
    finally:
        server.terminate()
        server.wait()


# An HTTP request's first line, as a client sends it to the object store.
REQUEST_LINE = re.compile(rb"^(?:GET|PUT|HEAD|POST|DELETE) \S+ HTTP/1\.1\r$", re.M)


class Proxy:
    """A TCP proxy to the object store that can stop (connections refused, open ones cut) and
    start again on its port, the server's objects kept behind it: a server that goes away."""

    def __init__(self, target_port: int):
        self.port, self.target = free_port(), target_port
        self.open: list[socket.socket] = []
        self.listener = None
        self.sent = {"to the server": 0, "from the server": 0}  # bytes, for benchmarks
        self.requests = 0  # HTTP requests passed to the server
        self.start()

    def start(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", self.port))
        threading.Thread(target=self.accept, args=(self.listener,), daemon=True).start()

    def stop(self) -> None:
        self.listener.close()
        for conn in self.open:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            conn.close()
        self.open.clear()

    def accept(self, listener) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.target))
            self.open += [client, server]
            for a, b, way in (
                (client, server, "to the server"),
                (server, client, "from the server"),
            ):
                threading.Thread(target=self.pipe, args=(a, b, way), daemon=True).start()

    def pipe(self, source, sink, way: str) -> None:
        try:
            while data := source.recv(1 << 16):
                sink.sendall(data)
                self.sent[way] += len(data)
                if way == "to the server":
                    self.requests += len(REQUEST_LINE.findall(data))
        except OSError:
            pass
        finally:
            for conn in (source, sink):
                try:
                    conn.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


class Flaky(http.server.ThreadingHTTPServer):
    """An HTTP proxy to moto's server that answers every other request as a throttled S3 does
    (503 SlowDown) or drops its connection unanswered (`drop`); the others pass."""

    def __init__(self, target: int, drop: bool = False):
        self.target, self.drop, self.seen = target, drop, 0
        super().__init__(("127.0.0.1", 0), FlakyHandler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class FlakyHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:
        pass

    def forward(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.server.seen += 1
        if self.server.seen % 2:
            if self.server.drop:
                self.close_connection = True
                return
            error = b"<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>"
            self.send_response(503)
            self.send_header("Content-Length", str(len(error)))
            self.end_headers()
            self.wfile.write(error)
            return
        upstream = http.client.HTTPConnection("127.0.0.1", self.server.target)
        upstream.request(self.command, self.path, body, dict(self.headers))
        answer = upstream.getresponse()
        data = answer.read()
        self.send_response(answer.status)
        length = answer.getheader("Content-Length") if self.command == "HEAD" else len(data)
        for name, value in answer.getheaders():
            if name.lower() not in ("content-length", "transfer-encoding", "connection"):
                self.send_header(name, value)
        self.send_header("Content-Length", str(length or 0))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_PUT = do_HEAD = do_POST = do_DELETE = forward


ISOLATED = REPO / "tests" / "workflow" / "isolated"


def in_s3_isolated(port: int, prefix: str) -> list[str]:
    """`snakemake`'s options for a run whose input, outputs and store are under s3://lab/PREFIX
    on moto's server at `port`, each job in an empty folder of its own (tests/workflow/isolated)."""
    return [
        "--executor", "cluster-generic",
        "--cluster-generic-submit-cmd", str(ISOLATED / "submit"),
        "--cluster-generic-status-cmd", str(ISOLATED / "status"),
        "--jobs", "4",
        "--default-storage-provider", "s3",
        "--default-storage-prefix", f"s3://lab/{prefix}",
        "--storage-s3-endpoint-url", f"http://127.0.0.1:{port}",
        "--shared-fs-usage", "none",
    ]  # fmt: skip


def s3_client(port: int, credentials: dict = S3_CREDENTIALS):
    import boto3

    return boto3.client(
        "s3",
        endpoint_url=f"http://127.0.0.1:{port}",
        region_name="us-east-1",
        aws_access_key_id=credentials["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=credentials["AWS_SECRET_ACCESS_KEY"],
    )


# The profiles of services whose jobs share no filesystem (their runs are in S3): their plugins.
CLOUD = {"awsbatch": "aws-batch", "kubernetes": "kubernetes", "googlebatch": "googlebatch"}


def edited_cloud_profile(name: str, prefix: str, port: int, folder: Path) -> Path:
    """A copy of the cloud profile `name` as its user edits it, for moto's server and the local
    executor: its prefix and server set, its placeholders gone, its plugin's own settings left
    out (the plugin is not installed here)."""
    profile = yaml.safe_load((REPO / "profiles" / name / "config.yaml").read_text())
    plugin = profile.pop("executor")
    assert plugin == CLOUD[name] and profile["shared-fs-usage"] == "none"
    assert profile["default-storage-provider"] == "s3"
    assert profile["default-storage-prefix"] == "s3://CHANGE-ME-bucket/esmshard"
    profile["default-storage-prefix"] = prefix
    profile["storage-s3-endpoint-url"] = f"http://127.0.0.1:{port}"
    for key in [k for k in profile if k.startswith(f"{plugin}-") or k == "container-image"]:
        del profile[key]
    assert "CHANGE-ME" not in yaml.safe_dump(profile)
    folder.mkdir()
    (folder / "config.yaml").write_text(yaml.safe_dump(profile))
    return folder
