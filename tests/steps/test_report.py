import html
import json
import re
import shutil
import subprocess
import time

import pytest
from helpers import MODEL, PROTEINS, REPO, config, snakemake, snakemake_command

from esmshard.steps.report import write_report
from esmshard.steps.report_scaling import replay


def metrics(shard, slot, start, seconds, residues=1000):
    return {
        "shard": shard, "gpu_slot": slot, "device": "cpu", "device_name": "cpu", "host": "node1",
        "cuda_visible_devices": str(slot), "started_at": start, "finished_at": start + seconds,
        "seconds": seconds, "load_seconds": 1.0, "compute_seconds": seconds - 1, "n_sequences": 10, "n_residues": residues,
        "n_failed": 0, "model": "random:esm2_t6_8M_UR50D", "weights": "random", "telemetry_samples": 0,
    }  # fmt: skip


def test_replay_models_devices_taking_the_next_shard():
    assert replay([4, 4, 4, 4], 1) == 16
    assert replay([4, 4, 4, 4], 2) == 8
    assert replay([10, 1, 1, 1], 2) == 10


def test_report_from_metrics_and_header_only_telemetry(tmp_path):
    runs = [
        metrics("shard_0000", 0, 100.0, 10.0),
        metrics("shard_0001", 1, 100.0, 10.0),
        metrics("shard_0002", 0, 110.0, 5.0)
        | {"compile_seconds": 0.5, "compile_cache": "hit"},  # the others: metrics of no `compile`
    ]
    metric_files, telemetry_files = [], []
    for m in runs:
        (tmp_path / f"{m['shard']}.json").write_text(json.dumps(m))
        (tmp_path / f"{m['shard']}.tsv").write_text(
            "time\tutilization_percent\tmemory_used_bytes\n"
        )
        metric_files.append(tmp_path / f"{m['shard']}.json")
        telemetry_files.append(tmp_path / f"{m['shard']}.tsv")
    result = write_report(
        metric_files, telemetry_files, tmp_path / "scaling.json", tmp_path / "report.html"
    )
    assert json.loads((tmp_path / "scaling.json").read_text()) == json.loads(json.dumps(result))
    assert (
        result["n_shards"] == 3
        and result["wall_seconds"] == 15.0
        and result["busy_seconds"] == 25.0
    )
    assert result["measured"]["gpus"] == 2 and result["measured"]["speedup"] == pytest.approx(
        25 / 15
    )
    assert result["load_imbalance"] == pytest.approx(10 / (25 / 3))
    assert result["telemetry"] is False
    assert result["compile_seconds"] == 0.5 and result["compile_cache_hits"] == 1
    # per slot: busy time, and the wait after its last shard for the run's last one
    busy = {d["slot"]: (d["busy_seconds"], d["idle_tail_seconds"]) for d in result["devices"]}
    assert busy == {"node1:0": (15.0, 0.0), "node1:1": (10.0, 5.0)}
    assert result["idle_tail_seconds"] == 5.0
    # a measured speedup only for the slot count this run had; the rest modelled
    measured = {m["gpus"]: m["measured_speedup"] for m in result["modelled"]}
    assert measured == {1: None, 2: pytest.approx(25 / 15), 4: None, 8: None}
    assert [s["compile_cache"] for s in result["shards"]] == ["off", "off", "hit"]
    page = (tmp_path / "report.html").read_text()
    assert (
        "No GPU telemetry" in page
        and "Random-weight model" in page
        and page.count("data:image/png") == 3
        and "<th>compiling (s)</th>" in page
        and "shards whose compiled code was in the store" in page
        and "<th>idle at the end (s)</th>" in page
        and "<th>modelled speedup (×)</th>" in page
        and "<th>measured on this run (×)</th>" in page
        and "kept by stopped jobs" not in page  # no shard resumed: no column of zeros
    )
    assert "_seconds" not in page and "GUIDE_SPEEDUP" not in page  # no code names
    # In words: the run's own speedup, the shard count's cap, the guides' range.
    assert "Measured on this run: its 2 slots together finished the shards 1.67× as fast" in page
    assert "This run had 3 shards: on more than 3 GPUs the others would have nothing to do" in page
    assert "stops at 2.50× (all the work over the longest shard)" in page
    assert "87.5–100% of the ideal speedup" in page and "esmshard/steps/" not in page
    assert "<details>" not in page  # two slots: their speedup is the point
    # one rate: the residues the jobs computed over the time any of them computed, after
    # loading (101 s to 110 s, and 111 s to 115 s)
    assert result["residues_per_second"] == 3000 / 13
    assert "231 residues/s" in page and "0m13s" in page


def test_one_slot_is_said_as_a_busy_share_not_a_speedup(tmp_path):
    runs = [metrics("a-0000", 0, 100.0, 4.0), metrics("a-0001", 0, 105.0, 4.0)]
    files = []
    for m in runs:
        (tmp_path / f"{m['shard']}.json").write_text(json.dumps(m))
        (tmp_path / f"{m['shard']}.tsv").write_text("time\tutilization_percent\n")
        files.append(tmp_path / f"{m['shard']}.json")
    write_report(files, [tmp_path / f"{m['shard']}.tsv" for m in runs], tmp_path / "s.json",
                 tmp_path / "r.html", out_figures=tmp_path / "figures")  # fmt: skip
    page = (tmp_path / "r.html").read_text()
    assert "its one slot was busy computing shards 89% of the time" in page
    # one CPU slot: the model of 1 to 8 GPUs folded away; the run's rate is its one device's
    assert "<details><summary>This run computed on one CPU slot" in page
    result = json.loads((tmp_path / "s.json").read_text())
    (device,) = result["devices"]
    assert result["residues_per_second"] == device["residues_per_second"] == 2000 / 6
    assert "0.89" not in page  # no "0.89×", which would read as a slowdown
    # the table says it too, as the busy share it is (not "–" beside a measured point)
    assert "<tr><td>1</td>" in page and "<td>89% busy</td>" in page
    assert sorted(p.name for p in (tmp_path / "figures").iterdir()) == [
        "devices.tsv", "shards.tsv", "speedup.png", "speedup.tsv", "throughput.png",
        "timeline.png",
    ]  # fmt: skip


def test_thousands_of_shards_list_the_slowest_and_say_where_the_rest_are(tmp_path):
    runs = [
        metrics(f"s{k:04d}", k % 8, 100.0 + k, 10.0 + (k * 7919) % 1000 / 100) for k in range(2000)
    ]
    metric_files, telemetry_files = [], []
    for m in runs:
        (tmp_path / f"{m['shard']}.json").write_text(json.dumps(m))
        (tmp_path / f"{m['shard']}.tsv").write_text("time\tutilization_percent\n")
        metric_files.append(tmp_path / f"{m['shard']}.json")
        telemetry_files.append(tmp_path / f"{m['shard']}.tsv")
    report = tmp_path / "report"
    report.mkdir()
    write_report(metric_files, telemetry_files, report / "scaling.json", report / "scaling_report.html",
                 out_figures=report / "figures")  # fmt: skip
    page = (report / "scaling_report.html").read_text()
    shards = page[page.index("<h2>Shards</h2>") :]
    assert (
        "The 100 slowest of 2,000 shards, slowest first; every shard is in scaling.json and"
        in shards
    )
    assert "<a href='figures/shards.tsv'>figures/shards.tsv</a>" in shards
    slowest = sorted(runs, key=lambda m: m["seconds"], reverse=True)
    listed = re.findall(r"<td>(s\d{4})</td>", shards)
    assert listed == [m["shard"] for m in slowest[:100]]
    assert len((report / "figures" / "shards.tsv").read_text().splitlines()) == 2001
    assert len(page) < 400_000  # a page, whatever the number of shards


def test_a_run_that_computed_nothing_says_so(tmp_path):
    result = write_report([], [], tmp_path / "scaling.json", tmp_path / "report.html")
    assert result["n_shards"] == 0
    assert json.loads((tmp_path / "scaling.json").read_text()) == result
    assert "computed nothing" in (tmp_path / "report.html").read_text()


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A run of four shards through the `snakemake` command line, as users type it."""
    workdir = tmp_path_factory.mktemp("report")
    snakemake(workdir, {}, *config(PROTEINS, "out", "shards=4", "include=[mean,per_tok]"))
    return workdir


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (CI installs it)")
def test_the_report_fits_a_1280_pixel_window_in_a_real_browser(finished_run, tmp_path):
    """Rendered by headless Chromium: no sideways scrolling of the page (wide tables scroll in
    their own boxes), and a screenshot a person can look at."""
    report = finished_run / "out" / "report" / "scaling_report.html"
    page = report.read_text()
    for said in ("This run", "this command's time, from its start to the merge", "command",
                 "time to result, from the run's plan to its merge (every command of the run)",
                 str(PROTEINS), "This run had 4 shards", "guides' range", "Measured on this run",
                 f"{MODEL} (ESM-2, pretrained weights)"):  # fmt: skip
        assert said in html.unescape(page), said
    # The page's own width, measured by the browser: a copy that writes it into its title.
    probe = tmp_path / "probe.html"
    probe.write_text(page.replace("</body>", WIDTH_PROBE + "</body>"))
    browser = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--window-size=1280,900"]
    dom = subprocess.run([*browser, "--dump-dom", probe.as_uri()], capture_output=True,
                         text=True, timeout=120).stdout  # fmt: skip
    found = re.search(r"<title>width (\d+) (\d+) (\d+)</title>", dom).groups()
    scroll, client, widest = map(int, found)
    assert 1200 <= client <= 1280 and scroll <= client, (scroll, client)
    assert widest <= client, f"a table {widest} px wide in a {client} px window"
    # the start and finish with their time zone; the measured busy share in its table
    zone = time.strftime("%Z")
    assert len(re.findall(rf"<td[^>]*>\d{{4}}-\d\d-\d\d \d\d:\d\d:\d\d {zone}", page)) == 2
    # the command as typed: here `snakemake ...` itself (`esmshard run`'s: test_readme.py)
    run = json.loads((finished_run / "out" / "run.json").read_text())
    assert run["typed_command"] is None and run["command"].split()[0].endswith("snakemake")
    assert f"<td class=label>command</td><td class=text>{html.escape(run['command'])}" in page
    slots = json.loads((report.parent / "scaling.json").read_text())["measured"]["gpus"]
    row = re.search(rf"<tr><td>{slots}</td>(?:<td>[^<]*</td>){{3}}<td>([^<]*)</td>", page)
    assert row and re.fullmatch(r"[\d.]+|\d+% busy", row.group(1)), row  # measured: no "–"
    shot = tmp_path / "report.png"
    subprocess.run([*browser, f"--screenshot={shot}", report.as_uri()], capture_output=True,
                   timeout=120, check=True)  # fmt: skip
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000


WIDTH_PROBE = (
    "<script>document.title = 'width ' + document.documentElement.scrollWidth + ' ' + "
    "document.documentElement.clientWidth + ' ' + Math.max(...Array.from("
    "document.querySelectorAll('table'), t => t.scrollWidth))</script>"
)


def test_snakemakes_own_report_holds_the_scaling_report(finished_run):
    """`snakemake --report`, as catalog workflows offer it: the page, its plots and tables."""
    cmd, env = snakemake_command(finished_run, {}, "--config", f"input={PROTEINS}", "outdir=out",
                                 f"model={MODEL}", "shards=4", "include=[mean,per_tok]",
                                 "--report", "snakemake-report.html")  # fmt: skip
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    page = (finished_run / "snakemake-report.html").read_text()
    assert "scaling_report.html" in page and "speedup.png" in page and "shards.tsv" in page


def test_the_report_gives_each_steps_own_time(finished_run):
    report = finished_run / "out" / "report"
    result = json.loads((report / "scaling.json").read_text())
    assert result["step_seconds"]["shard"] > 0 and result["step_seconds"]["merge"] > 0
    page = html.unescape((report / "scaling_report.html").read_text())
    assert re.search(r"the steps' own time: shard; embed jobs; merge</td><td class=text>"
                     r"\dm\d\ds; \dm\d\ds; \dm\d\ds</td>", page), page[:3000]  # fmt: skip
