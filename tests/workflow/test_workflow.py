"""End to end through the `snakemake` command line, on real proteins with a tiny random ESM-2."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
import yaml
from helpers import (
    CONFIG_SCHEMA,
    MODEL,
    NUCLEOTIDE,
    PROTEINS,
    REPO,
    TINY_MODEL,
    clone_of_workflow,
    config,
    fair_esm_model,
    fasta,
    jobs_run,
    read_records,
    snakemake,
    snakemake_command,
)

from esmshard.compute.batching import make_batches
from esmshard.files import read_tsv

RECORDS = read_records(PROTEINS)
IDS = [header[1:].split()[0] for header, _ in RECORDS]


def max_overlap(metrics) -> int:
    events = sorted(
        [(m["started_at"], 1) for m in metrics] + [(m["finished_at"], -1) for m in metrics]
    )
    running = peak = 0
    for _, step in events:
        running += step
        peak = max(peak, running)
    return peak


def load_metrics(outdir):
    return [json.loads(p.read_text()) for p in sorted((outdir / "metrics").glob("*.json"))]


def read_means(outdir, layer=6):
    with h5py.File(outdir / "embeddings.h5") as h5:
        return h5["ids"].asstr()[:].tolist(), h5[f"mean/{layer}"][:]


@pytest.fixture(scope="module")
def four_gpu_run(tmp_path_factory, checkpoint):
    workdir = tmp_path_factory.mktemp("four_gpus")
    config = {
        "input": str(PROTEINS),
        "model": str(checkpoint),
        "shards": 8,
        "gpus": [0, 1, 2, 3],
        "include": ["mean", "per_tok", "bos"],
        "repr_layers": [0, -1],
    }
    result = snakemake(workdir, config, "--resources", "gpu=4")
    return workdir / "results", result


def test_four_slot_run_gives_every_output(four_gpu_run):
    outdir, result = four_gpu_run
    assert (outdir / "embeddings.h5").is_file()
    assert len(list((outdir / "metrics").glob("*.json"))) == 8
    assert (outdir / "report" / "scaling.json").is_file()
    html = (outdir / "report" / "scaling_report.html").read_text()
    assert html.count("data:image/png;base64,") == 3 and "Random-weight" not in html
    # No NVML on this machine: one note per job log, no telemetry, and the report says so.
    assert "No GPU telemetry: NVML was not available" in html
    assert (outdir / "failed_sequences.tsv").read_text() == "id\tsource\treason\n"
    assert "0 records failed, listed in" in result.stderr
    scaling = json.loads((outdir / "report" / "scaling.json").read_text())
    assert scaling["n_shards"] == 8 and scaling["n_sequences"] == 40
    assert [m["gpus"] for m in scaling["modelled"]] == [1, 2, 4, 8]
    for metrics in load_metrics(outdir):
        for key in (
            "shard",
            "n_sequences",
            "n_residues",
            "seconds",
            "started_at",
            "finished_at",
            "device",
            "gpu_slot",
        ):
            assert key in metrics
        assert metrics["device"] == "cpu" and metrics["gpu_slot"] in range(4)
        # default truncate policy: batched residues are the first 1022 of each record
        lengths = [
            min(len(r["sequence"]), 1022)
            for r in read_tsv(outdir / "shards" / f"{metrics['shard']}.tsv")
        ]
        # batching auto: ESM-2's fast path packs its batches, whose budget counts real tokens
        assert metrics["batching"] == "packed" and metrics["padded_fraction"] == 0.0
        assert metrics["n_batches"] == len(make_batches(lengths, metrics["token_budget"], True))
    log = sorted((outdir / "logs" / "embed").glob("*.log"))[0].read_text()
    assert "computing on the CPU" in log
    assert log.count("NVML is not available") == 1
    assert scaling["telemetry"] is False and len(list((outdir / "telemetry").glob("*.tsv"))) == 8
    assert len(scaling["devices"]) == len({m["gpu_slot"] for m in load_metrics(outdir)})
    assert result.stderr.count(" done on cpu: ") == 8 and "shard 8/8 done" in result.stderr


def test_overlapping_shard_jobs_hold_different_slots(four_gpu_run):
    metrics = load_metrics(four_gpu_run[0])
    assert max_overlap(metrics) > 1, "the jobs never ran at the same time"
    for a in metrics:
        for b in metrics:
            if (
                a is not b
                and a["started_at"] < b["finished_at"]
                and b["started_at"] < a["finished_at"]
            ):
                assert a["gpu_slot"] != b["gpu_slot"], (a["shard"], b["shard"])


def fair_esm_reference(checkpoint):
    """fair-esm's own loader and batch converter, one sequence at a time (no batching)."""
    net, alphabet = fair_esm_model(checkpoint)
    convert = alphabet.get_batch_converter(truncation_seq_length=1022)
    for name, seq in zip(IDS, (s for _, s in RECORDS)):
        _, _, toks = convert([(name, seq)])
        with torch.no_grad():
            reps = net(toks, repr_layers=[0, 6])["representations"]
        n = min(len(seq), 1022)
        yield (
            name,
            {layer: rep[0, 1 : n + 1].numpy() for layer, rep in reps.items()},
            reps[6][0, 0].numpy(),
        )


def test_embeddings_equal_plain_fair_esm_forward(four_gpu_run, checkpoint):
    outdir, _ = four_gpu_run
    with h5py.File(outdir / "embeddings.h5") as h5:
        assert h5["ids"].asstr()[:].tolist() == IDS
        assert h5.attrs["weights"] == "pretrained" and h5.attrs["precision"] == "fp32"
        assert h5.attrs["truncation_seq_length"] == 1022
        offsets = h5["per_tok/offsets"][:]
        assert (
            offsets[-1] == h5["per_tok/6"].shape[0] == sum(min(len(s), 1022) for _, s in RECORDS)
        )
        for row, (name, per_tok, bos) in enumerate(fair_esm_reference(checkpoint)):
            for layer in (0, 6):
                np.testing.assert_allclose(
                    h5[f"mean/{layer}"][row], per_tok[layer].mean(0), atol=1e-4, err_msg=name
                )
            np.testing.assert_allclose(
                h5["per_tok/6"][offsets[row] : offsets[row + 1]], per_tok[6], atol=1e-4
            )
            np.testing.assert_allclose(h5["bos/6"][row], bos, atol=1e-4)
        assert h5["truncated"][:].sum() == sum(len(s) > 1022 for _, s in RECORDS) == 3


def test_shard_count_and_batching_do_not_change_embeddings_and_gpu_limit_holds(
    tmp_path, four_gpu_run, checkpoint
):
    # against the four-slot run: 8 shards of packed batches on four slots
    config = {"input": str(PROTEINS), "model": str(checkpoint), "gpus": [0, 1, 2, 3], "shards": 3}
    snakemake(tmp_path / "three", config, "--resources", "gpu=2", "--config", "batching=padded")
    ids_eight, eight = read_means(four_gpu_run[0])
    ids_three, three = read_means(tmp_path / "three" / "results")
    assert ids_eight == ids_three == IDS
    np.testing.assert_allclose(eight, three, atol=1e-5)
    metrics = load_metrics(tmp_path / "three" / "results")
    assert len(metrics) == 3 and max_overlap(metrics) == 2
    assert {m["batching"] for m in metrics} == {"padded"}
    assert {m["batching"] for m in load_metrics(four_gpu_run[0])} == {"packed"}


def test_duplicate_ids_across_files_stop_the_run(tmp_path):
    second = tmp_path / "more.fasta"
    second.write_text("".join(f"{h}\n{s}\n" for h, s in RECORDS[10:12]))
    result = snakemake(
        tmp_path,
        {"input": [str(PROTEINS), str(second)], "model": f"random:{TINY_MODEL}", "shards": 2},
        check=False,
    )
    assert result.returncode != 0
    assert f"duplicate IDs (2 IDs): '{IDS[10]}' at {PROTEINS}:" in result.stderr
    assert f"and at {second}:1" in result.stderr
    assert not (tmp_path / "results" / "embeddings.h5").exists()
    assert not list((tmp_path / "results").rglob("*.h5"))  # nothing computed or stored


def test_a_nucleotide_file_with_duplicate_ids_is_named_for_both_in_one_run(tmp_path):
    records = read_records(NUCLEOTIDE)
    proteins = read_records(PROTEINS)  # first: the first records are checked before any job
    genes = tmp_path / "genes.ffn"  # real nucleotide records after proteins, one given twice
    genes.write_text("".join(f"{h}\n{s}\n" for h, s in proteins + records + records[:1]))
    first = 2 * len(proteins) + 1
    result = snakemake(tmp_path, {}, "--config", f"input=[{genes}]", f"model={MODEL}", check=False)
    assert result.returncode != 0
    err = result.stderr
    assert "the input has 2 kinds of problem" in err
    assert err.index(f"{genes}: 11 records") < err.index("duplicate IDs (1 ID)")
    assert (
        f"'{records[0][0][1:].split()[0]}' at {genes}:{first} and at {genes}:{first + 20}" in err
    )
    assert "shard.log" in err and not (tmp_path / "results" / "shards").exists()
    # Plain snakemake: the reason once, no stack lines of esmshard's making (docs/running.md
    # shows the rest, Snakemake's own report of the failed job)
    assert err.count("the input has 2 kinds of problem") == 1
    # (the clone's own path left out: the README clones it into a folder named esmshard)
    outside = err.replace(str(REPO), "<clone>").replace("esmshard/workflow", "")
    assert "Traceback" not in err and "esmshard/" not in outside
    # As it says: "Fix them all, then run the same command again" (the genes and the repeat out)
    assert "Fix them all, then run the same command again" in err
    genes.write_text("".join(f"{h}\n{s}\n" for h, s in proteins))
    snakemake(tmp_path, {}, "--config", f"input=[{genes}]", f"model={MODEL}")
    assert (tmp_path / "results" / "embeddings.h5").is_file()


def test_hub_model_without_network_fails_before_shard_work(tmp_path):
    env = {
        "TORCH_HOME": str(tmp_path / "torch"),
        "https_proxy": "http://127.0.0.1:9",
        "HTTPS_PROXY": "http://127.0.0.1:9",
    }
    result = snakemake(
        tmp_path, {"input": str(PROTEINS), "model": "esm2_t33_650M_UR50D"}, env=env, check=False
    )
    assert result.returncode != 0
    assert "cannot download esm2_t33_650M_UR50D" in result.stderr
    assert str(tmp_path / "torch") in result.stderr and "local .pt checkpoint" in result.stderr
    assert not (tmp_path / "results" / "shards").exists() or not list(
        (tmp_path / "results" / "shards").glob("*.tsv")
    )


def test_lint_reports_nothing_in_a_clone_without_input_or_network(tmp_path):
    clone = clone_of_workflow(tmp_path / "clone")
    assert not (clone / "resources").exists()
    env = {**os.environ, "https_proxy": "http://127.0.0.1:9", "http_proxy": "http://127.0.0.1:9"}
    result = subprocess.run(
        [sys.executable, "-m", "snakemake", "--lint"], cwd=clone, env=env, capture_output=True,
        text=True,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert (
        "Congratulations, your workflow is in a good condition!" in result.stdout + result.stderr
    )


def test_config_file_documents_every_key_with_its_default():
    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    assert set(config) == set(CONFIG_SCHEMA["properties"])
    for key, value in config.items():
        if key != "input":
            assert CONFIG_SCHEMA["properties"][key]["default"] == value, key


def test_runs_from_another_working_directory_with_the_default_config(tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "snakemake",
            "-s",
            str(REPO / "Snakefile"),
            "-d",
            str(tmp_path),
            "--dry-run",
            "--config",
            f"input={PROTEINS}",
            f"model=random:{TINY_MODEL}",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "embed" in result.stdout


def split_input(folder):
    """The test proteins as two files, as users pass several."""
    folder.mkdir(parents=True, exist_ok=True)
    a, b = folder / "a.fasta", folder / "b.fasta"
    a.write_text("".join(f"{h}\n{s}\n" for h, s in RECORDS[:6]))
    b.write_text("".join(f"{h}\n{s}\n" for h, s in RECORDS[6:12]))
    return a, b


def test_keys_typed_on_the_command_line_mean_what_a_config_file_says(tmp_path):
    a, b = split_input(tmp_path / "in")
    keys = {"gpus": [0, 1], "repr_layers": [-1, 3], "include": ["mean", "bos"], "input": [str(a), str(b)],
            "model": MODEL, "shards": 2}  # fmt: skip
    typed = ["gpus=[0,1]", "repr_layers=[-1,3]", "include=[mean,bos]", f"input=[{a},{b}]",
             f"model={MODEL}", "shards=2"]  # fmt: skip
    cmd, env = snakemake_command(tmp_path, {}, "--resources", "gpu=2", "--config", *typed)
    result = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    with h5py.File(tmp_path / "results" / "embeddings.h5") as got:
        assert sorted(got["mean"]) == sorted(got["bos"]) == ["3", "6"] and "per_tok" not in got
        assert got["ids"].asstr()[:].tolist() == IDS[:12]
    slots = {m["cuda_visible_devices"] for m in load_metrics(tmp_path / "results")}
    assert slots <= {"0", "1"}
    # The config file's form in the same folder finds nothing to do: the same settings (another
    # layer, kind or input would run again), and the typed command again neither.
    again = snakemake(tmp_path, keys, "--resources", "gpu=2")
    assert "Nothing to be done" in again.stdout + again.stderr
    again = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    assert again.returncode == 0 and "Nothing to be done" in again.stdout + again.stderr


def test_a_target_short_of_the_full_run_succeeds(tmp_path):
    cmd, env = snakemake_command(
        tmp_path, {"input": str(PROTEINS), "model": MODEL}, "--until", "shard"
    )
    result = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "results" / "shards" / "plan.tsv").is_file()
    assert not list((tmp_path / "results").rglob("*.h5")) and "Error" not in result.stderr

    # `snakemake embedded`: every embed job, no merge.
    cmd, env = snakemake_command(tmp_path, {"input": str(PROTEINS), "model": MODEL}, "embedded")
    result = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert len(list((tmp_path / "results" / "store").rglob("*.h5"))) == 1  # one auto shard
    assert not (tmp_path / "results" / "embeddings.h5").exists()


def python_without_esmshard(folder) -> Path:
    """An interpreter with this environment's third-party packages but no esmshard installed."""
    import sysconfig

    subprocess.run([sys._base_executable, "-m", "venv", "--without-pip", str(folder)], check=True)
    (site,) = folder.glob("lib/python*/site-packages")
    # A plain path entry: the .pth files there (esmshard's editable install among them) stay unread.
    (site / "third_party.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return folder / "bin" / "python"


def test_workflow_runs_its_own_esmshard_under_an_interpreter_without_it(tmp_path):
    python = python_without_esmshard(tmp_path / "bare")
    assert subprocess.run([python, "-c", "import torch, snakemake, esm"]).returncode == 0
    assert subprocess.run([python, "-c", "import esmshard"], cwd=tmp_path).returncode != 0
    decoy = tmp_path / "host" / "esmshard"  # an installed copy that must not be picked up
    decoy.mkdir(parents=True)
    (decoy / "__init__.py").write_text(
        "raise ImportError('the host copy of esmshard was imported')\n"
    )
    workdir = tmp_path / "run"
    workdir.mkdir()
    cmd = [python, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "-d", str(workdir), "--cores", "2",
           "--config", f"input=[{PROTEINS}]", f"model={MODEL}"]  # fmt: skip
    env = {
        **os.environ,
        "PYTHONPATH": str(tmp_path / "host"),
        "ESMSHARD_POOL_DIR": str(tmp_path / "pool"),
    }
    result = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    with h5py.File(workdir / "results" / "embeddings.h5") as h5:
        assert h5["ids"].asstr()[:].tolist() == IDS


def test_dot_test_runs_as_the_workflow_catalog_runs_it(tmp_path):
    """The catalog's template: `snakemake --directory .test` with .test/config/config.yaml, from the repository."""
    dot_test = tmp_path / ".test"
    shutil.copytree(REPO / ".test", dot_test)
    config = yaml.safe_load((dot_test / "config" / "config.yaml").read_text())
    assert config["model"] == f"random:{TINY_MODEL}"
    for path in config["input"]:  # the slice of real data it names is made at run time
        (dot_test / path).parent.mkdir(parents=True, exist_ok=True)
        (dot_test / path).write_text(PROTEINS.read_text())
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "ESMSHARD_POOL_DIR": str(tmp_path / "pool")}  # fmt: skip
    result = subprocess.run(["snakemake", "--cores", "2", "--directory", str(dot_test)], cwd=REPO, env=env,
                            capture_output=True, text=True)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    outdir = dot_test / config["outdir"]
    with h5py.File(outdir / "embeddings.h5") as h5:
        assert h5.attrs["weights"] == "random" and len(h5["ids"]) == len(IDS)
    assert "Random-weight" in (outdir / "report" / "scaling_report.html").read_text()


def test_output_options_typed_on_the_command_line_rerun_only_the_merge(tmp_path):
    """float16 and gzip as users type them; switching back recomputes nothing but the merge."""
    a, _ = split_input(tmp_path / "in")
    typed = [f"input={a}", f"model={MODEL}", "include=[mean,per_tok]"]
    results = tmp_path / "run" / "results"

    def run(*extra):
        cmd, env = snakemake_command(tmp_path / "run", {}, "--config", *typed, *extra)
        result = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
        assert result.returncode == 0, result.stderr
        return result.stdout + result.stderr

    run()
    with h5py.File(results / "embeddings.h5") as h5:
        float32 = {name: h5[name][:] for name in ("mean/6", "per_tok/6")}
    shard_files = {p: p.stat().st_mtime_ns for p in (results / "store").rglob("*.h5")}
    output = run("output_dtype=float16", "per_residue_compression=gzip")
    assert "rule embed" not in output and "rule merge" in output
    assert {p: p.stat().st_mtime_ns for p in shard_files} == shard_files
    with h5py.File(results / "embeddings.h5") as h5:
        assert h5["per_tok/6"].compression == "gzip" and h5["mean/6"].compression is None
        assert h5.attrs["output_dtype"] == "float16"
        for name, want in float32.items():
            got = h5[name][:]
            assert got.dtype == np.float16
            # the README's bound for float16
            assert np.all(np.abs(got.astype(np.float32) - want) <= 2**-11 * np.abs(want) + 2**-25)


def test_a_touched_script_or_a_moved_clone_reruns_no_finished_shard(tmp_path):
    """Finished shards re-run only for what changes their numbers: the embedding settings."""
    workdir = tmp_path / "run"
    workdir.mkdir()

    small = fasta(tmp_path / "small.fasta", read_records(PROTEINS)[:6])

    def run(clone, *more):
        cmd = [sys.executable, "-m", "snakemake", "-s", str(clone / "Snakefile"), "-d",
               str(workdir), "--cores", "2", "--resources", "gpu=1", "--config",
               f"input=[{small}]", f"model={MODEL}", "shards=2", *more]  # fmt: skip
        env = {**os.environ, "ESMSHARD_POOL_DIR": str(tmp_path / "pool")}
        result = subprocess.run(cmd, cwd=workdir, env=env, capture_output=True, text=True)
        assert result.returncode == 0, result.stderr[-3000:]
        return jobs_run(result)

    first = clone_of_workflow(tmp_path / "clone")
    assert run(first)["embed"] == 2
    touched = [*first.glob("workflow/scripts/*.py"), *first.glob("esmshard/**/*.py")]
    for script in touched:  # a `git pull` touching the scripts and the package
        script.touch()
    moved = first.rename(tmp_path / "moved")
    again = run(moved)
    assert "embed" not in again and "shard" not in again, again
    assert run(moved, "repr_layers=[3]")["embed"] == 2


def test_a_run_with_other_settings_into_an_outdir_says_in_one_line_what_it_replaces(tmp_path):
    small = fasta(tmp_path / "small.fasta", read_records(PROTEINS)[:5])
    first = snakemake(tmp_path, {}, *config(small, "out"))
    assert "replaces" not in first.stdout + first.stderr
    second = snakemake(tmp_path, {}, *config(small, "out"), "repr_layers=[-1,3]")
    said = [line for line in (second.stdout + second.stderr).splitlines() if "replaces" in line]
    assert len(said) == 1 and said[0].startswith(
        f"esmshard: out/embeddings.h5 holds {MODEL}'s embeddings of other settings (key "
    ), said
    assert said[0].endswith("the earlier numbers stay in the store (`esmshard store` lists them)")
