"""What `esmshard run` shows of Snakemake's output (esmshard.commands.console), on a real disk
that fills up."""

import io
import sys
import tempfile
import threading

from conftest import fill, small_disk

from esmshard.commands.console import run_quietly


def test_a_disk_that_fills_while_the_output_is_logged_is_one_line_and_the_run_goes_on(
    tmp_path, monkeypatch
):
    """The temporary log and the outdir's logs/ on a full disk: the command's own exit status,
    esmshard's lines all shown, one line saying the output could not be kept, no traceback."""
    talk = (
        "import sys\n"
        "for n in range(20000):\n"
        "    print(f'snakemake says line {n} ' + 'x' * 60)\n"
        "print('esmshard: the last line of the run')\n"
        "sys.exit(3)\n"
    )
    with small_disk(tmp_path / "disk", 1) as disk:
        (disk / "out" / "logs").mkdir(parents=True)
        monkeypatch.setattr(tempfile, "tempdir", str(disk))
        fill(disk, 0)
        shown, status = io.StringIO(), []
        showing = threading.Thread(
            target=lambda: status.append(
                run_quietly([sys.executable, "-c", talk], {}, str(disk / "out"), shown)
            ),
            daemon=True,
        )
        showing.start()
        showing.join(timeout=120)  # a reader stopped by the full disk left it waiting for ever
        assert not showing.is_alive(), "esmshard run hangs once the disk is full"
    lines = shown.getvalue().splitlines()
    assert status == [3]
    assert lines == [
        "esmshard: the last line of the run",
        "esmshard run: Snakemake's output could not all be kept (No space left on device): "
        f"what it said of each job is in {disk / 'out' / 'logs'}",
    ]
