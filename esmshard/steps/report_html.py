"""Write the scaling report's HTML page and the tables it holds."""

import base64
import html
import re
import time

from ..compute.provenance import COMPUTED_WITH, mixed_precisions
from ..models import FAMILIES
from ..version import __version__
from .progress import duration, rate
from .report_scaling import MODELLED_GPUS

TITLE = f"esmshard {__version__} scaling report"
NOTHING_COMPUTED = "This run computed nothing: the store held every sequence."
# The Shards table lists the slowest this many (every shard is in scaling.json and shards.tsv),
# so that a run of thousands of shards stays a page a browser shows at once.
LISTED_SHARDS = 100


# Each table column's heading, with its unit: one place for every table of the report.
HEADINGS = {
    "reference_rows": "reference rows",
    "rows_per_second": "reference rows/s",
    "index": "index",
    "recall": "recall@k (sampled queries)",
    "index_built": "index built now",
    "gpus": "GPUs",
    "modelled_makespan_seconds": "modelled time (s)",
    "modelled_speedup": "modelled speedup (×)",
    "modelled_efficiency_percent": "modelled efficiency (% of ideal)",
    "measured_speedup": "measured on this run (×)",
    "guide_speedup": "guides' range (×)",
    "slot": "slot",
    "device": "device",
    "name": "GPU",
    "shards": "shards",
    "residues_per_second": "residues/s",
    "busy_seconds": "busy (s)",
    "idle_tail_seconds": "idle at the end (s)",
    "mean_utilization_percent": "mean utilization (%)",
    "mean_memory_used_GiB": "mean memory used (GiB)",
    "peak_memory_used_GiB": "peak memory used (GiB)",
    "memory_total_GiB": "memory (GiB)",
    "shard": "shard",
    "started_offset": "started at (s)",
    "seconds": "time (s)",
    "load_seconds": "loading (s)",
    "compile_seconds": "compiling (s)",
    "compile_cache": "compiled code",
    "n_sequences": "sequences",
    "n_residues": "residues",
    "n_residues_kept": "of them kept by stopped jobs",
    "what": "what",
    "value": "value",
    "parts": "parts",
}
SPEEDUP_COLUMNS = ["gpus", "modelled_makespan_seconds", "modelled_speedup",
                   "modelled_efficiency_percent", "measured_speedup", "guide_speedup"]  # fmt: skip
DEVICE_COLUMNS = ["slot", "device", "name", "shards", "residues_per_second", "busy_seconds",
                  "idle_tail_seconds", "mean_utilization_percent", "mean_memory_used_GiB",
                  "peak_memory_used_GiB", "memory_total_GiB"]  # fmt: skip
SHARD_COLUMNS = ["shard", "slot", "device", "started_offset", "seconds", "load_seconds",
                 "compile_seconds", "compile_cache", "n_sequences", "n_residues",
                 "n_residues_kept", "residues_per_second"]  # fmt: skip
STYLE = """body{font-family:sans-serif;max-width:1180px;margin:auto;padding:0 16px;line-height:1.4}
.wide{overflow-x:auto;max-width:100%;margin:1em 0}table{border-collapse:collapse}
td,th{border:1px solid #ccc;padding:3px 8px;text-align:right;white-space:nowrap}
th{background:#f3f3f3;white-space:normal;min-width:4em}td.label{text-align:left;white-space:normal}
p.text{word-break:break-all}
td.text{text-align:left;white-space:normal;word-break:break-all}
.warn{color:#a00;font-weight:bold}img{display:block;margin:1em 0;max-width:100%;height:auto}"""


def _table(rows, columns, text=(), labels=()) -> str:
    """A table in a box of its own that scrolls sideways where the page is too narrow; the
    columns in `labels` hold words, and those in `text` long strings that may break anywhere (a
    command, a path): both wrap and align left."""

    def cell(row, column):
        kind = " class=text" if column in text else " class=label" if column in labels else ""
        return f"<td{kind}>{html.escape(_fmt(row[column])).replace(chr(10), '<br>')}</td>"

    head = "".join(f"<th>{html.escape(HEADINGS.get(c, c))}</th>" for c in columns)
    body = "".join("<tr>" + "".join(cell(r, c) for c in columns) + "</tr>" for r in rows)
    return f"<div class=wide><table><tr>{head}</tr>{body}</table></div>"


def table_rows(rows, columns) -> list[list[str]]:
    """A table's rows as text, as the report's TSV files hold them."""
    return [[_fmt(r[c]) for c in columns] for r in rows]


def _gib(value):
    return value / (1 << 30) if value is not None else None


def _fmt(value) -> str:
    """A cell as people read it: a float to the digits that mean something (351.41 -> 351)."""
    if isinstance(value, float):
        digits = 0 if abs(value) >= 100 else 1 if abs(value) >= 10 else 2
        return f"{value:,.{digits}f}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    if isinstance(value, list):
        return "–".join(_fmt(v) for v in value)
    return "–" if value is None else str(value)


def _when(seconds) -> str:
    """A moment with its time zone (the machine's), and its offset from UTC where that is not
    UTC itself."""
    if not seconds:
        return "–"
    moment = time.localtime(seconds)
    zone = time.strftime("%Z", moment)
    offset = "" if zone == "UTC" else time.strftime(" (UTC%z)", moment)
    return time.strftime("%Y-%m-%d %H:%M:%S ", moment) + zone + offset


def measured_sentence(measured: dict) -> str:
    """The run's own speedup, said in words (a speedup below 1 on one slot is no slowdown)."""
    k, speedup = measured["gpus"], measured["speedup"]
    if speedup is None:
        return "Measured on this run: nothing (its shards took no time)."
    if k == 1:
        return (
            f"Measured on this run: its one slot was busy computing shards {speedup:.0%} of the "
            "time from the first shard's start to the last shard's end (the rest went to "
            "starting jobs between shards)."
        )
    return (
        f"Measured on this run: its {k} slots together finished the shards {speedup:.2f}× as "
        f"fast as one slot running them back to back would, {speedup / k:.0%} of the ideal {k}×."
    )


def cap_sentence(result: dict) -> str:
    """Where the shard count, or the longest shard, caps the modelled speedup."""
    durations = [s["seconds"] for s in result["shards"]]
    longest = max(durations)
    cap = sum(durations) / longest if longest > 0 else 1.0
    n, most = result["n_shards"], max(MODELLED_GPUS)
    if n < most:
        return (
            f"This run had {n} shard{'s' if n > 1 else ''}: on more than {n} GPU"
            f"{'s' if n > 1 else ''} the others would have nothing to do, so the modelled "
            f"speedup stops at {cap:.2f}× (all the work over the longest shard). More shards "
            "(`shards: N`; `auto` plans at least one per GPU of the pool) let more GPUs help."
        )
    if cap < 0.875 * most:
        return (
            f"The longest shard caps the modelled speedup at {cap:.2f}× (all the work over the "
            "longest shard): more, smaller shards would let more GPUs help."
        )
    return ""


GUIDES_SENTENCE = (
    "The guides' range is near-linear scaling, 87.5–100% of the ideal speedup (1.8–2× on 2 GPUs, "
    "3.5–4× on 4, 7–8× on 8): the yardstick esmshard holds itself to for data-parallel "
    "inference, where each GPU embeds its own shards and the GPUs exchange nothing. It is a "
    "target, not a measurement."
)


def _model(model: str, family: str | None, weights: str) -> str:
    """The model, its family as people name it, and whether its weights are random."""
    named = f"{FAMILIES[family].named}, " if family in FAMILIES else ""
    return f"{model} ({named}{weights} weights)"


def run_rows(result: dict, run: dict) -> list[dict]:
    """The run itself: when, how long, what command on which inputs, with which model."""
    started, finished = run.get("started_at"), run.get("finished_at")
    made_by = run.get("made_by") or {}
    planned = run.get("planned_at")

    def per_second(value, what):
        return f"{rate(value)} {what}/s" if value else "–"

    rows = [
        ("started", _when(started)),
        ("finished", _when(finished)),
        # a run stopped and finished by the same command again: every command's time
        (
            "time to result, from the run's plan to its merge (every command of the run)",
            duration(finished - planned) if planned and finished else "–",
        ),
        (
            "this command's time, from its start to the merge",
            duration(finished - started) if started and finished else "–",
        ),
        # as the user typed it (`esmshard run`); the Snakemake command it ran is folded below
        ("command", run.get("typed_command") or run.get("command") or "–"),
        ("working folder", run.get("workdir") or "–"),
        ("inputs", "\n".join(run.get("inputs", [])) or "–"),
        ("model", _model(made_by.get("model", result["model"]), made_by.get("model_family"),
                         result["weights"])),
        ("shards", result["n_shards"]),
        ("sequences / residues", f"{result['n_sequences']:,} / {result['n_residues']:,}"
         + (f" ({result['n_residues_kept']:,} kept by stopped jobs, computed before)"
            if result.get("n_residues_kept") else "")),
        ("failed sequences", result["n_failed"]),
        ("time the embed jobs computed (side by side once; loading and the time between "
         "commands left out"
         + (f"; {result['stopped_jobs']} stopped jobs' time in" if result.get("stopped_jobs")
            else "") + ")",
         duration(result.get("jobs_seconds", result["wall_seconds"]))),
        ("the steps' own time: shard; embed jobs; merge",
         "; ".join(duration(t) if t is not None else "–" for t in (
             result.get("step_seconds", {}).get("shard"),
             result.get("jobs_seconds", result["wall_seconds"]),
             result.get("step_seconds", {}).get("merge")))),
        ("speed: residues the finished jobs computed over their own time",
         per_second(result["residues_per_second"], "residues")),
        ("forward-pass tokens of the finished jobs over their time (a masked copy counts its own)",
         per_second(result.get("forward_tokens_per_second"), "tokens")),
        ("load imbalance (slowest shard / mean shard)", result["load_imbalance"]),
        ("idle tail (s): the first slot out of shards waits for the last one", result["idle_tail_seconds"]),
        (
            "compiling (s); shards whose compiled code was in the store",
            f"{_fmt(result['compile_seconds'])}; {result['compile_cache_hits']} of {result['n_shards']}",
        ),
    ]  # fmt: skip
    return [{"what": what, "value": value} for what, value in rows]


def mutants_rows(mutants: dict) -> list[dict]:
    """The mutants' run, for the report's page."""
    rows = [
        ("where", mutants["outdir"]),
        ("mutant sequences: computed; found in the store",
         f"{mutants['computed']:,}; {mutants['from_store']:,}"),
    ]  # fmt: skip
    if "n_shards" in mutants:
        tokens = mutants["forward_tokens_per_second"]
        rows += [
            ("shards", mutants["n_shards"]),
            ("time the embed jobs computed", duration(mutants["jobs_seconds"])),
            ("forward passes' tokens (each residue's masked copy its own)",
             f"{mutants['forward_tokens']:,}" + (f", {rate(tokens)} tokens/s" if tokens else "")),
            ("failed sequences", mutants["n_failed"]),
        ]  # fmt: skip
    planned, finished = mutants.get("planned_at"), mutants.get("finished_at")
    if planned and finished:
        rows.append(("time from its plan to its merge", duration(finished - planned)))
    return [{"what": what, "value": value} for what, value in rows]


def speedup_rows(result: dict) -> list[dict]:
    """The speedup table: on one GPU the measured figure is a busy share, said as one (as a
    speedup, 0.95× would read as a slowdown)."""

    def measured(m):
        if m["measured_speedup"] is None or m["gpus"] > 1:
            return m["measured_speedup"]
        return f"{m['measured_speedup']:.0%} busy"

    return [
        {
            **m,
            "modelled_efficiency_percent": 100 * m["modelled_efficiency"],
            "measured_speedup": measured(m),
        }
        for m in result["modelled"]
    ]


def _words(text: str) -> str:
    """A sentence as HTML, `code` in backticks shown as code."""
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(text))


def device_rows(result: dict) -> list[dict]:
    return [
        {
            **d,
            "memory_total_GiB": _gib(d["memory_total_bytes"]),
            "mean_memory_used_GiB": _gib(d["mean_memory_used_bytes"]),
            "peak_memory_used_GiB": _gib(d["peak_memory_used_bytes"]),
        }
        for d in result["devices"]
    ]


def _image(png: bytes, alt: str) -> str:
    return f'<img alt="{alt}" src="data:image/png;base64,{base64.b64encode(png).decode()}">'


def shards_section(result: dict, tables: str | None) -> str:
    """The Shards table: every shard, or the LISTED_SHARDS slowest, saying where the rest are."""
    shards = result["shards"]
    # A shard's residues/s is over what its own job computed: the residues that stopped jobs
    # kept are shown beside its residues where a shard has any.
    columns = SHARD_COLUMNS
    if not any(s["n_residues_kept"] for s in shards):
        columns = [c for c in SHARD_COLUMNS if c != "n_residues_kept"]
    if len(shards) <= LISTED_SHARDS:
        return _table(shards, columns)
    slowest = sorted(shards, key=lambda s: s["seconds"], reverse=True)[:LISTED_SHARDS]
    every = "scaling.json" + (f" and <a href='{html.escape(tables)}'>{html.escape(tables)}</a>"
                              if tables else "")  # fmt: skip
    return (
        f"<p>The {LISTED_SHARDS} slowest of {len(shards):,} shards, slowest first; every shard "
        f"is in {every}.</p>" + _table(slowest, columns)
    )


def snakemake_command(run: dict) -> str:
    """The Snakemake command that `esmshard run` ran, folded (the typed one is the table's)."""
    if not run.get("typed_command") or not run.get("command"):
        return ""
    return (
        "<details><summary>The snakemake command that esmshard run ran</summary>"
        f"<p class=text><code>{html.escape(run['command'])}</code></p></details>"
    )


def render_html(
    result: dict, shown: dict[str, bytes], run: dict, computed_with: str = "", tables=None
) -> str:
    """The report's page; `tables`: the path of the Shards table's TSV file, from the page."""
    warning = ""
    if result["weights"] == "random":
        warning = "<p class=warn>Random-weight model: these embeddings are for testing and benchmarking only.</p>"
    if "devices" in shown:
        device_section = _image(shown["devices"], "devices over time")
    else:
        device_section = "<p>No GPU telemetry: NVML was not available to the jobs.</p>"
    cap = cap_sentence(result)
    speedup = f"""<p>{_words(measured_sentence(result["measured"]))}</p>
<p>Modelled: the measured shard times replayed, in their start order, on that many GPUs, each
shard on the first GPU to free up. {_words(cap)}</p>
<p>{_words(GUIDES_SENTENCE)}</p>
{_table(speedup_rows(result), SPEEDUP_COLUMNS)}
{_image(shown["speedup"], "speedup")}"""
    if len(result["devices"]) == 1 and not result["devices"][0]["device"].startswith("cuda"):
        # one CPU slot: a model of 1 to 8 GPUs is not what its reader came for
        speedup = (
            "<details><summary>This run computed on one CPU slot: the model of the same "
            f"shards on 1, 2, 4 and 8 GPUs</summary>{speedup}</details>"
        )
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1"><title>{TITLE}</title>
<style>{STYLE}</style>
</head><body><h1>{TITLE}</h1>{warning}
<h2>This run</h2>
{_table(run_rows(result, run), ["what", "value"], text=("value",), labels=("what",))}
{snakemake_command(run)}
<h2>Speedup and efficiency</h2>
{speedup}
{_image(shown["timeline"], "shard jobs per device slot")}
{_image(shown["throughput"], "throughput per shard")}
<h2>Devices</h2>
{_table(device_rows(result), DEVICE_COLUMNS)}
{device_section}
<h2>Shards</h2>
{shards_section(result, tables)}
{mutants_section(result.get("mutants"))}
{neighbours_section(result.get("neighbours"))}
{computed_with}
</body></html>
"""


def mutants_section(mutants: dict | None) -> str:
    if not mutants:
        return ""
    table = _table(mutants_rows(mutants), ["what", "value"], text=("value",), labels=("what",))
    return f"<h2>The mutants' run (pseudo_ppl, pllr)</h2>{table}"


def neighbours_section(neighbours: dict | None) -> str:
    """The search jobs of `neighbours`: each part's rows, device, time and rate."""
    if not neighbours:
        return ""
    columns = ["part", "device", "reference_rows", "queries", "seconds", "rows_per_second"]
    overall = (
        f"<p>{neighbours['jobs']} search jobs: {neighbours['reference_rows']:,} reference rows "
        f"against {neighbours['queries']:,} proteins in {duration(neighbours['seconds'])} of "
        f"search, {rate(neighbours['rows_per_second'])} reference rows/s.</p>"
    )
    search = neighbours.get("search")
    asked = (
        _table(search_rows(search), ["what", "value"], text=("value",), labels=("what",))
        if search
        else ""
    )
    parts = neighbours["parts"]
    if any(p.get("index", "exact") != "exact" for p in parts):  # an approximate index: how good
        columns += ["index", "recall", "index_built"]
        parts = [{"index": "exact", "recall": None, "index_built": None, **p} for p in parts]
    return f"<h2>Nearest neighbours</h2>{overall}{asked}" + _table(parts, columns)


def search_rows(search: dict) -> list[dict]:
    """What the search was asked, and the command that ran it, which may be a later one than
    the embedding's (a search added to a finished run)."""
    rows = [
        ("reference", search["reference"]),
        ("neighbours per protein (k)", search["k"]),
        ("distance", search["metric"]),
        ("layer of the mean embeddings", search["layer"]),
        ("command", search.get("command") or "–"),
        ("finished", _when(search.get("finished_at"))),
    ]
    return [{"what": what, "value": value} for what, value in rows]


def computed_with_section(run: dict) -> str:
    """What computed the run's embeddings (the store's parts included), and a warning where
    they mix precisions."""
    rows = run.get("computed_with", [])
    mixed = mixed_precisions(rows)
    warning = f"<p class=warn>{html.escape(mixed[0].upper() + mixed[1:])}.</p>" if mixed else ""
    made_by = [{"what": name, "value": value} for name, value in run.get("made_by", {}).items()]
    return (
        "<h2>Computed with</h2>"
        + _table(made_by, ["what", "value"], text=("value",), labels=("what",))
        + warning
        + _table(rows, [*COMPUTED_WITH, "parts"])
    )
