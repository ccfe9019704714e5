"""A new user's first commands, typed as the README teaches them: every mistake is a few lines
naming the key or file, before any job, with exit status 2 and nothing written; a run says what it
does in a few lines, and every failure ends it with its reason."""

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import (
    GENE_CALLER,
    LONG_PROTEIN,
    MODEL,
    NUCLEOTIDE,
    PROTEINS,
    TINY_MODEL,
    snakemake,
    write_subset,
)

ESMSHARD = Path(sys.executable).parent / "esmshard"
RANDOM = f"random:{TINY_MODEL}"
STACK_LINE = 'File "'


def esmshard(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(ESMSHARD), *args], cwd=cwd, capture_output=True, text=True)


def ours(stderr: str) -> list[str]:
    """The lines esmshard itself wrote (Snakemake adds which profile and config it read)."""
    return [line for line in stderr.splitlines() if line.startswith("esmshard")]


def refused(done: subprocess.CompletedProcess, folder: Path, *messages: str) -> None:
    """Exit status 2, the messages each on a line of esmshard's, few lines, no stack lines, and
    nothing written where the outputs would go."""
    text = done.stdout + done.stderr
    assert done.returncode == 2, text[-3000:]
    assert "Traceback" not in text and STACK_LINE not in text, text[-3000:]
    assert len(text.strip().splitlines()) <= 4 + len(messages), text
    for message in messages:
        assert any(message in line for line in ours(done.stderr)), (message, text)
    assert not (folder / "out").exists()


def test_a_mistyped_key_is_one_line_naming_the_key_meant(tmp_path):
    done = esmshard("run", str(GENE_CALLER), "-o", "out", "--model", RANDOM, "--config",
                    "repr_layer=[-1]", cwd=tmp_path)  # fmt: skip
    refused(done, tmp_path, "repr_layer: not a config key of esmshard; did you mean repr_layers?")


def test_a_model_name_cut_short_is_one_line_naming_the_name_meant(tmp_path):
    done = esmshard("run", str(GENE_CALLER), "-o", "out", "--config", "model=esm2_t6_8M",
                    cwd=tmp_path)  # fmt: skip
    refused(done, tmp_path, "model 'esm2_t6_8M': not a model name esmshard knows; did you mean "
            "esm2_t6_8M_UR50D? (esmshard run --help lists every way to name a model)")  # fmt: skip
    assert "esm1b_t33_650M_UR50S" not in done.stderr  # not the whole list


def test_every_mistake_of_one_command_is_named_at_once_before_any_job(tmp_path):
    done = snakemake(
        tmp_path, {}, "--config", f"input={GENE_CALLER}", "outdir=out", "model=random:esmc_300m",
        "repr_layers=[99,-1]", "include=[mean,contacts]", "precision=fp4", "shard=4", check=False,
    )  # fmt: skip
    refused(
        done,
        tmp_path,
        "repr_layers: layer 99 does not exist in esmc_300m, which has 30 layers; give 0 to 30",
        "include: contacts: ESM C (random:esmc_300m) has no contact head",
        "precision: fp4 is not valid; give one of auto, fp32, bf16, fp16, fp8",
        "shard: not a config key of esmshard; did you mean shards?",
    )
    assert not list(tmp_path.glob("**/logs"))


def test_a_nucleotide_file_is_one_line_before_any_job(tmp_path):
    done = esmshard("run", str(NUCLEOTIDE), "-o", "out", "--model", RANDOM, cwd=tmp_path)
    refused(done, tmp_path, f"input FASTA '{NUCLEOTIDE}' holds nucleotide sequences")
    assert "nucleotide_check: false" in done.stderr


def test_a_checkpoint_copied_without_its_contact_regression_file_is_one_line(tmp_path):
    alone = tmp_path / "esm2_t6_micro.pt"  # fair-esm's format is two files; one was copied
    shutil.copy(MODEL, alone)
    done = esmshard("run", str(GENE_CALLER), "-o", "out", "--model", str(alone), cwd=tmp_path)
    regression = tmp_path / "esm2_t6_micro-contact-regression.pt"
    refused(done, tmp_path, f"model checkpoint '{alone}': its contact-regression weights "
                            f"'{regression}' are not beside it")  # fmt: skip


def test_an_input_where_the_run_writes_has_no_stack_lines(tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "embeddings.h5").write_bytes(b"the user's\n")
    done = snakemake(tmp_path, {}, "--config", "input=out/embeddings.h5", "outdir=out",
                     f"model={RANDOM}", check=False)  # fmt: skip
    assert done.returncode == 2 and STACK_LINE not in done.stderr, done.stderr
    assert "input FASTA 'out/embeddings.h5' is where this run writes" in done.stderr
    assert (tmp_path / "out" / "embeddings.h5").read_bytes() == b"the user's\n"


@pytest.mark.parametrize(
    "typed",
    [
        ["--config", f"model={RANDOM}", "repr_layers=[-1]", str(GENE_CALLER), "-o", "out"],
        [str(GENE_CALLER), "--config", f"model={RANDOM}", "outdir=out", "gpus=[0]"],
        ["--config", f"input={GENE_CALLER}", f"model={RANDOM}", "-o", "out"],
    ],
)
def test_esmshard_run_takes_config_keys_for_its_options_in_any_order(tmp_path, typed):
    """In a Snakemake project's folder, whose config/config.yaml is not esmshard's."""
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "config.yaml").write_text("samples: samples.tsv\nthreads: 8\n")
    done = esmshard("run", *typed, "--", "--dry-run", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    printed = done.stderr.splitlines()[0]
    assert printed.startswith("esmshard run: ESMSHARD_WORKFLOW_CONFIG=1 snakemake ")
    assert f"model={RANDOM}" in printed and "outdir=out" in printed


def test_an_option_and_a_config_key_that_disagree_are_refused(tmp_path):
    done = esmshard("run", str(GENE_CALLER), "-o", "out", "--model", RANDOM, "--config",
                    "model=esm2_t12_35M_UR50D", cwd=tmp_path)  # fmt: skip
    assert done.returncode == 2 and done.stderr == (
        "esmshard run: --config model= and the option for model say different things; give one\n"
    )


def test_help_names_every_family_and_every_way_to_name_a_model(tmp_path):
    top = esmshard("--help", cwd=tmp_path).stdout
    assert all(name in top for name in ("ESM-2", "ESM C", "ProtT5", "Ankh"))
    model_help = " ".join(esmshard("run", "--help", cwd=tmp_path).stdout.split())
    for way in ("random:NAME", "hf:OWNER/NAME", "folder saved by transformers", ".pt or .pth"):
        assert way in model_help


def test_a_truncated_protein_is_said_on_the_console_in_the_log_and_in_run_json(tmp_path):
    done = snakemake(tmp_path, {}, "--config", f"input={LONG_PROTEIN}", "outdir=out",
                     f"model={MODEL}")  # fmt: skip
    said = "1 record is longer than 1022 residues, the longest"
    lines = [line for line in done.stderr.splitlines() if said in line]
    assert lines and "(7,096 residues" in lines[0] and "truncated to their first 1022" in lines[0]
    assert said in (tmp_path / "out" / "logs" / "shard.log").read_text()
    run = json.loads((tmp_path / "out" / "run.json").read_text())
    assert (run["long_records"], run["long_sequences"]) == (1, "truncate")
    closing = [
        line
        for line in done.stderr.splitlines()
        if "esmshard: 1 record, 1 unique sequence," in line
    ]
    assert f"embedded with {MODEL}" in closing[0]
    assert closing[0].endswith("; 1 longer than truncation_seq_length, truncated")
    assert "esmshard: outputs: out/embeddings.h5, out/failed_sequences.tsv" in done.stderr


def test_a_run_says_what_it_does_in_a_few_lines_and_keeps_snakemakes_output(tmp_path):
    done = esmshard("run", str(GENE_CALLER), str(LONG_PROTEIN), "-o", "out", "--model", MODEL,
                    "--gpus", "0", cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stderr.splitlines()
    assert len(lines) <= 10, done.stderr
    assert "Select jobs to execute" not in done.stderr and "rule embed" not in done.stderr
    assert any("1 record is longer than 1022 residues" in line for line in lines)
    assert any(line.startswith("shards 1/1 (100%)") and "finished" in line for line in lines)
    assert any(line.startswith("esmshard: 27 records, 27 unique sequences") for line in lines)
    assert lines[-1] == "esmshard run: Snakemake's whole output is in out/logs/esmshard-run.log"
    # The same command again: nothing to do, and it says so
    again = esmshard("run", str(GENE_CALLER), str(LONG_PROTEIN), "-o", "out", "--model", MODEL,
                     "--gpus", "0", cwd=tmp_path)  # fmt: skip
    assert again.returncode == 0 and len(again.stderr.splitlines()) <= 6, again.stderr
    assert "esmshard run: nothing to do: every output is there and up to date" in again.stderr
    kept = (tmp_path / "out" / "logs" / "esmshard-run.log").read_text()
    assert "Select jobs to execute" in kept and "Finished jobid" in kept
    # Watching a finished run shows it and ends by itself.
    watched = subprocess.run([str(ESMSHARD), "status", "out", "--watch", "0.2"], cwd=tmp_path,
                             capture_output=True, text=True, timeout=60)  # fmt: skip
    assert watched.returncode == 0 and "shards 1/1 (100%)" in watched.stdout
    verbose = esmshard("run", str(GENE_CALLER), "-o", "out", "--model", MODEL, "--verbose",
                       cwd=tmp_path)  # fmt: skip
    assert verbose.returncode == 0 and "Building DAG of jobs" in verbose.stdout + verbose.stderr


def test_a_failed_job_ends_the_command_with_its_reason_and_its_log(tmp_path):
    bad = tmp_path / "bad.fasta"
    bad.write_text(GENE_CALLER.read_text() + ">bad\nMKV1L\n")
    done = esmshard("run", "bad.fasta", "-o", "out", "--model", MODEL, cwd=tmp_path)
    assert done.returncode == 1
    lines = done.stderr.splitlines()
    assert len(lines) == 4 and "Traceback" not in done.stderr, done.stderr
    assert lines[1].startswith("esmshard run: a job failed (its log: out/logs/shard.log): ")
    assert "bad.fasta:53: character '1' is not an amino-acid letter" in lines[2]
    assert lines[3].endswith("out/logs/esmshard-run.log")


def test_on_a_terminal_the_progress_is_one_line_redrawn(tmp_path):
    """Under a pseudo-terminal (util-linux's script), as a person sees it."""
    command = f"{ESMSHARD} run {GENE_CALLER} -o out --model {MODEL}"
    done = subprocess.run(["script", "-qec", command, "/dev/null"], cwd=tmp_path,
                          capture_output=True)  # fmt: skip
    shown = done.stdout.decode()  # as bytes: text mode would take each \r for a new line
    assert done.returncode == 0, shown[-3000:]
    assert "\r\033[Kshards 1/1 (100%)" in shown
    assert "Select jobs to execute" not in shown


def test_a_run_logged_to_a_file_writes_a_progress_line_every_so_often_with_its_eta(tmp_path):
    """`esmshard run ... > run.log` (sbatch, nohup): lines within the one shard, each with an
    ETA once the rate is known, and the shard's end once. The micro model's batches made to
    last, as a large model's do: seconds of a shard at little CPU."""
    command = (f"{ESMSHARD} run {PROTEINS} -o out --model {MODEL} --config shards=1 "
               "toks_per_batch=2048 --progress-every 1 > run.log 2>&1")  # fmt: skip
    slow = {**os.environ, "ESMSHARD_TEST_SECONDS_PER_BATCH": "0.75"}
    subprocess.run(command, shell=True, cwd=tmp_path, env=slow, check=True)
    lines = (tmp_path / "run.log").read_text().splitlines()
    progress = [line for line in lines if line.startswith("shards ")]
    within = [line for line in progress if line.startswith("shards 0/1 ")]
    assert len(within) >= 3, lines
    assert re.search(r"residues [1-9][\d,]*/[\d,]+ .* ETA \d+m\d\ds", within[-1]), within
    assert [line for line in progress if line.startswith("shards 1/1 (100%)")] == [progress[-1]]
    assert progress[-1].endswith("finished")


def importing(outdir: Path) -> bool:
    """An embed job has logged its start and is importing torch and the model's code."""
    return any("run_shard: started" in log.read_text() for log in outdir.glob("logs/embed/*.log"))


def embedding(outdir: Path) -> bool:
    """An embed job has written its first progress: it is embedding."""
    return any((outdir / "progress").glob("*.json"))


@pytest.mark.parametrize("moment", [importing, embedding])
def test_ctrl_c_ends_esmshard_run_in_one_line_and_the_same_command_goes_on(tmp_path, moment):
    command = [str(ESMSHARD), "run", str(PROTEINS), "-o", "out", "--model", MODEL]

    def as_in_a_terminal():  # Ctrl-C's default action, whatever this test's parent left ignored
        signal.signal(signal.SIGINT, signal.SIG_DFL)

    run = subprocess.Popen(command, cwd=tmp_path, stderr=subprocess.PIPE, text=True,
                           start_new_session=True, preexec_fn=as_in_a_terminal)  # fmt: skip
    deadline = time.monotonic() + 120
    while not moment(tmp_path / "out") and time.monotonic() < deadline:
        time.sleep(0.01)
    os.killpg(run.pid, signal.SIGINT)  # as a terminal sends Ctrl-C to its foreground group
    said = run.communicate(timeout=120)[1]
    assert run.returncode == 130 and "Traceback" not in said, said
    # One line says what is kept (the shard may finish as the signal comes) and names the
    # command as it was typed (not the Snakemake command it started), after the progress; then
    # where Snakemake's output is.
    stop, where = said.splitlines()[-2:]
    typed = shlex.join(["esmshard", *command[1:]])
    assert re.fullmatch(
        r"esmshard: stopped; [01] of 1 shards finished, [\d,]+ of [\d,]+ residues done( \([\d,]+ "
        rf"kept from stopped jobs\))?: the same command finishes the run: {re.escape(typed)}",
        stop,
    ), said
    assert where == "esmshard run: Snakemake's whole output is in out/logs/esmshard-run.log"
    assert "interrupted" not in said, said
    # What plain `snakemake` would have shown: the job's one line, no traceback.
    snakemake_output = (tmp_path / "out" / "logs" / "esmshard-run.log").read_text()
    assert "stopped by SIGINT (Ctrl-C)" in snakemake_output
    assert "Traceback" not in snakemake_output and "KeyboardInterrupt" not in snakemake_output
    if moment is importing:  # the job stopped before it had loaded anything
        (log,) = (tmp_path / "out" / "logs" / "embed").glob("*.log")
        said = [line.split(" esmshard: ")[-1] for line in log.read_text().splitlines()]
        assert said == [said[0], "run_shard: stopped by SIGINT (Ctrl-C); what it finished is "
                        "kept, its incomplete outputs are removed"]  # fmt: skip
        assert said[0].startswith("run_shard: started")
    again = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True)
    assert again.returncode == 0, again.stderr[-2000:]
    assert (tmp_path / "out" / "embeddings.h5").is_file()
    # What the stopped command kept is said before the progress, which starts from it.
    lines = again.stderr.splitlines()
    progress = [n for n, line in enumerate(lines) if line.startswith("shards ")]
    resuming = [n for n, line in enumerate(lines) if line.startswith("esmshard: resuming: ")]
    assert progress and all(n < progress[0] for n in resuming), again.stderr


def processes_of(folder: Path) -> list[str]:
    """The command lines of the processes that name `folder` (a run's, its jobs')."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, ValueError):
            continue
        if str(folder) in cmdline and proc.name.isdigit() and int(proc.name) != os.getpid():
            found.append(f"{proc.name}: {cmdline}")
    return found


# A shard of about a minute on the CPU: a workflow left running would outlive the checks below.
MINUTE = write_subset("ecoli_every_4th.fasta", lambda i, header, sequence: i % 4 == 0)


@pytest.mark.parametrize(
    "sig, group",
    [(signal.SIGKILL, False), (signal.SIGKILL, True), (signal.SIGHUP, False)],
    ids=["kill-9", "kill-9-of-the-group", "hangup"],
)
def test_killing_esmshard_run_itself_ends_its_workflow_and_the_same_command_runs_at_once(
    tmp_path, sig, group
):
    # esmshard run's own process alone, as a closed terminal or a dropped SSH session ends it;
    # or `kill -9 -- -PGID` of its group, and the same command typed at once, while the killed
    # run's workflow is still ending: it waits for it, not refused
    out = tmp_path / "out"
    command = [str(ESMSHARD), "run", str(MINUTE), "-o", str(out), "--model",
               f"random:{TINY_MODEL}"]  # fmt: skip
    # Killed as a batch begins, of seconds: the job ends after it, its workflow with the job
    slow = {**os.environ, "ESMSHARD_TEST_SECONDS_PER_BATCH": "8"} if group else None
    run = subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.DEVNULL, env=slow,
                           stderr=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    deadline = time.monotonic() + 120
    while not done_residues(out):
        assert run.poll() is None and time.monotonic() < deadline
        time.sleep(0.01)
    if group:
        os.killpg(run.pid, sig)
        run.wait(timeout=60)
        assert processes_of(out)  # still ending when the same command starts
    else:
        os.kill(run.pid, sig)
        run.wait(timeout=60)
        deadline = time.monotonic() + 15  # far less than the shard's minute
        while processes_of(out) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not processes_of(out)
    # The same command, at once: not refused, it goes on from what the stopped job kept.
    again = subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True, start_new_session=True)  # fmt: skip
    logs = out / "logs" / "embed"
    deadline = time.monotonic() + 120
    while not any("kept by an earlier job" in log.read_text() for log in logs.glob("*.log")):
        assert again.poll() is None and time.monotonic() < deadline, again.stderr.read()
        time.sleep(0.05)
    os.killpg(again.pid, signal.SIGINT)
    assert again.wait(timeout=60) == 130
    said = again.stderr.read()
    assert "another esmshard run is active" not in said and "Traceback" not in said
    # where the killed run's Snakemake had not ended yet, it was waited for, and said once
    # (tests/store/test_runlock.py holds a run in that state for certain)
    assert said.count("still ending") <= 1


def done_residues(outdir: Path) -> int:
    for path in (outdir / "progress").glob("*.json"):
        try:
            return json.loads(path.read_text())["residues_done"]
        except (OSError, ValueError, KeyError):
            pass
    return 0
