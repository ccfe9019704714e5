"""What `esmshard run` shows of Snakemake's output (esmshard.commands.console), on a real disk
that fills up."""

import subprocess
import sys

from helpers import fill, small_disk


def test_a_disk_that_fills_while_the_output_is_logged_is_one_line_and_the_run_goes_on(tmp_path):
    """The temporary log and the outdir's logs/ on a full disk: the command's own exit status,
    esmshard's lines all shown, one line saying the output could not be kept, no traceback (a
    reader stopped by the full disk had left the command waiting for ever)."""
    talk = (
        "import sys\n"
        "for n in range(20000):\n"
        "    print(f'snakemake says line {n} ' + 'x' * 60)\n"
        "print('esmshard: the last line of the run')\n"
        "sys.exit(3)\n"
    )
    with small_disk(tmp_path / "disk", 1) as disk:
        (disk / "out" / "logs").mkdir(parents=True)
        fill(disk, 0)
        shown = subprocess.run(
            [sys.executable, "-c", "import sys\nfrom esmshard.commands.console import run_quietly\n"
             "sys.exit(run_quietly([sys.executable, '-c', sys.argv[1]], {}, sys.argv[2]))",
             talk, str(disk / "out")],
            env={"TMPDIR": str(disk)}, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    assert shown.returncode == 3
    assert shown.stderr.splitlines() == [
        "esmshard: the last line of the run",
        "esmshard run: Snakemake's output could not all be kept (No space left on device): "
        f"what it said of each job is in {disk / 'out' / 'logs'}",
    ]


def test_the_progress_starts_after_the_workflow_says_what_an_earlier_command_kept(tmp_path):
    """A resumed run: Snakemake reads the workflow (seconds), whose start says what the stopped
    command kept; the progress drawn from the run's state comes after that line, not before."""
    import json

    from esmshard.store import Store

    (tmp_path / "shards").mkdir()
    (tmp_path / "shards" / "plan.tsv").write_text(
        "shard\tn_sequences\tn_residues\testimated_cost\nshard_0000\t5\t1000\t1000\n"
    )
    store = Store(str(tmp_path / "store"))
    (tmp_path / "shards" / "plan.json").write_text(json.dumps({"store": store.root, "key": "k1"}))
    snakemake = (
        "import time\n"
        "time.sleep(1.5)  # reading the workflow\n"
        "print('esmshard: resuming: 0 of 1 shards finished, 400 of 1,000 residues done', flush=True)\n"
        "print('Building DAG of jobs...', flush=True)\n"
        "time.sleep(1.5)\n"
    )
    shown = subprocess.run(
        [sys.executable, "-c", "import sys\nfrom esmshard.commands.console import run_quietly\n"
         "sys.exit(run_quietly([sys.executable, '-c', sys.argv[1]], {}, sys.argv[2]))",
         snakemake, str(tmp_path)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    lines = shown.stderr.splitlines()
    assert lines[0].startswith("esmshard: resuming: ") and lines[1].startswith("shards 0/1 (0%)")
