"""Write `make gpu-check`'s record as Markdown: each stage's results beside its goals."""

from .gpucheck_plan import FP8_GOALS, GPU_PLAN, STAGES

# The GPUs that the goals are set for: each goal is an H200's, and an H100's is 0.9 of it.
GOAL_SHARES = {"H200": 1.0, "H100": 0.9}


def goal_on(device: str, goal: int) -> tuple[str, int] | None:
    """(the kind of GPU `device` is, its share of the H200's `goal`), where it has one."""
    for kind, share in GOAL_SHARES.items():
        if kind in device:
            return kind, round(goal * share)
    return None


# The whole run's goal on an H200, with loading (esm2_t33 on the E. coli proteome, one GPU):
# tokens/s.
WHOLE_RUN_GOAL = 150_000


def whole_run_goal_lines(model: str, run: dict) -> list[str]:
    """The GPU plan's whole run against its goal on the GPUs that have one."""
    if model != GPU_PLAN["model"]:
        return []
    lines = []
    goals = dict.fromkeys(goal_on(device, WHOLE_RUN_GOAL) for device in run["devices"])
    for kind, goal in filter(None, goals):  # each kind once, in the devices' order
        speed = run["whole_shard_tokens_per_s_with_loading"]
        lines += [f"With loading on an {kind}: {speed:,.0f} tokens/s (goal {goal:,}).", ""]
    return lines


def whole_run_lines(model: str, run: dict) -> list[str]:
    lines = ["", f"## A whole run: {model}", f"`{run['command']}`", ""]
    if "shards" not in run:
        return lines + ["The run failed:", "```", run.get("error", ""), "```"]
    compiling = "not compiled; "  # off, or shards too short to repay it (compile: auto)
    if run["compile_cache"] != ["off"]:
        compiling = (
            f"compiling {run['compile_seconds']:.1f} s (cache: "
            f"{', '.join(run['compile_cache'])}), {run['whole_shard_tokens_per_s_compiled']:,.0f} "
            "tokens/s once loaded and compiled; "
        )
    lines += [
        f"{run['sequences']} sequences, {run['tokens']:,} tokens in {run['shards']} shard(s) "
        f"on {', '.join(run['devices'])} ({', '.join(run['precisions'])}); whole-shard "
        f"{run['whole_shard_tokens_per_s_with_loading']:,.0f} tokens/s with model loading "
        f"({run['load_seconds']:.1f} s), {run['whole_shard_tokens_per_s_loaded']:,.0f} tokens/s "
        f"once loaded (read-back and writing included); {compiling}"
        "the host's own work per batch (tokens, read-back, checks, writing) "
        f"{run['host_fraction']:.1%} of the batches' time; "
        f"{run['telemetry_samples']} telemetry samples, mean utilization "
        f"{run['mean_utilization_percent'] or 0:.0f}%.",
        "",
    ]
    lines += whole_run_goal_lines(model, run)
    return lines + [f"- [{'x' if ok else ' '}] {name}" for name, ok in run["checks"].items()]


def markdown(result: dict) -> str:
    env = result["environment"]
    lines = [
        f"# esmshard gpu-check, {result['date']}",
        "",
        f"Device: {env['device']} ({env['gpus']} GPU(s)), driver {env['driver']}, torch "
        f"{env['torch']}, CUDA {env['cuda']}, Python {env['python']}, esmshard {env['esmshard']}, "
        f"{env['cpus']} CPUs.",
        "",
    ]
    if not env["gpu"]:
        lines += ["**No GPU was found**: the plumbing ran on the CPU with a small model.", ""]
    if result["stages"] != list(STAGES):
        lines += [f"Stages: {', '.join(result['stages'])} (of {', '.join(STAGES)}).", ""]
    lines += [f"- {line}" for line in result["skipped"]] + [""] * bool(result["skipped"])
    tests = result["tests"]
    if tests is not None:
        lines += [
            "## GPU tests",
            f"{tests['passed']} passed, {tests['failed']} failed, {tests['skipped']} skipped "
            f"({tests['seconds']:.0f} s)"
            + "".join(f"\n- failed: {n}" for n in tests["failures"])
            + (f"\n\nThey did not run: {tests['error']}" if tests.get("error") else ""),
            "",
            "Each family's forward pass in bf16 against its fp32 one is one of them: "
            + "; ".join(result["plan"].get("families", []))
            + ".",
            "",
        ]
    for model, run in result["workflows"].items():
        lines += whole_run_lines(model, run)
    if result["masked_marginals"] is not None:
        lines += masked_lines(result["masked_marginals"])
    if result["peers"] is not None:
        lines += peers_lines(result["peers"])
    if result["throughput"] is not None:
        lines += throughput_lines(result["throughput"])
    if result["largest"] is not None:
        lines += largest_lines(result["largest"])
    if result.get("neighbours") is not None:
        lines += neighbours_lines(result["neighbours"])
    verdict = "pass" if result["ok"] else "FAIL"
    if not result["finished"]:
        return "\n".join(lines + ["", unfinished(result)]) + "\n"
    skipped = f", {len(result['skipped'])} part(s) skipped" if result["skipped"] else ""
    lines += ["", f"Verdict: **{verdict}** ({result['seconds']:.0f} s{skipped})"]
    return "\n".join(lines) + "\n"


def throughput_lines(bench: dict) -> list[str]:
    lines = ["", "## Forward-pass throughput", f"`{bench['command']}`", ""]
    table = [r for r in bench["rows"] if "side" in r]
    if table:
        lines += [
            "| model | side | precision | tokens/s | TFLOP/s | peak TFLOP/s | fraction of peak | "
            "speed-up | host's share |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for r in table:
            lines.append(
                f"| {r['model']} | {r['side']} | {r['precision']} | {r['tokens_per_second']:,.0f} | "
                f"{r['achieved_gflops'] / 1e3:,.1f} | {r['matmul_peak_gflops'] / 1e3:,.1f} | "
                f"{r['fraction_of_peak']:.1%} | {r['speedup_vs_peer']:.2f}× | "
                + (f"{r['host_fraction']:.0%} |" if r.get("host_fraction") is not None else "– |")
            )
    lines += failure_lines(bench)
    return lines


def masked_lines(bench: dict) -> list[str]:
    lines = ["", "## Masked marginals", f"`{bench['command']}`", ""]
    rows = [r for r in bench["rows"] if "tokens_per_s" in r]
    if rows:
        lines += [
            f"{rows[0]['proteins']} proteins, {rows[0]['masked_tokens']:,} forward tokens, "
            f"{rows[0]['layers']} layers of {rows[0]['model']}'s shape:",
            "",
            "| side | precision | tokens/s | against predict.py's loop | error to predict.py's |",
            "|---|---|---|---|---|",
        ]
        lines += [
            f"| {r['side']} | {r['precision']} | {r['tokens_per_s']:,.0f} | "
            f"{r['speedup_over_predict_py']:.2f}× | {r['error_to_predict_py']:.2g} "
            f"({r['error_kind']}) |"
            for r in rows
        ]
    lines += [
        f"\nEvery substitution of the proteome on this device: {r['this_device_hours']:,.2f} h "
        f"({r['this_device_tokens_per_s']:,.0f} tokens/s of the whole model, {r['side']})."
        for r in bench["rows"]
        if "extrapolated" in r
    ]
    lines += failure_lines(bench)
    return lines


def peers_lines(peers: dict) -> list[str]:
    lines = ["", "## Peers side by side", f"`{peers['command']}`", ""]
    lines += [f"- skipped: {r['skipped']}: {r['why']}" for r in peers["rows"] if "skipped" in r]
    rows = [r for r in peers["rows"] if "share_of_peak" in r]
    if rows:
        lines += [
            "| model | side | precision | tokens/s | share of peak | speed-up | baseline |",
            "|---|---|---|---|---|---|---|",
        ]
        lines += [
            f"| {r['model']} | {r['side']} | {r['precision']} | {r['tokens_per_s']:,.0f} | "
            f"{r['share_of_peak']:.1%} | {r['speedup_vs_baseline']:.2f}× | {r['baseline']} |"
            for r in rows
        ]
    lines += fp8_lines(rows)
    profiled = [r for r in peers["rows"] if "profiled_seconds" in r]
    if profiled:
        lines += ["", "Where the time goes (torch's profiler, one run each; profile.txt):", ""]
    lines += [profiled_line(r) for r in profiled]
    lines += failure_lines(peers)
    return lines


def profiled_line(row: dict) -> str:
    """A profiled side (benchmarks/peers.py --profile): its wall time, the device's busy share,
    and where the time went, class by class (its kernels', and the host's gaps)."""
    busy = row["device_busy_share"]
    spent = {**row["seconds_by_class"], "host gaps": row["host_gap_seconds"] or 0.0}
    classes = ", ".join(
        f"{name} {seconds:.3f} s ({seconds / row['profiled_seconds']:.0%})"
        for name, seconds in sorted(spent.items(), key=lambda item: -item[1])
        if seconds > 0
    )
    return (
        f"- {row['model']}, {row['side']} ({row['precision']}): {row['profiled_seconds']:.2f} s"
        + (f", the device busy {busy:.0%} of it" if busy is not None else "")
        + f": {classes}"
    )


# The largest models' goals in bf16 on an H200 (GOAL_SHARES: elsewhere), tokens/s
BIG_GOALS = {"esm2_t36_3B_UR50D": 90_000, "esm2_t48_15B_UR50D": 17_000, "esmc_6b": 40_000}


def failure_lines(bench: dict) -> list[str]:
    """What a failed benchmark printed last (gpucheck.run_benchmark keeps it), as a block."""
    return ["The benchmark failed:", "```", bench["error"], "```"] if bench["error"] else []


def neighbours_lines(bench: dict) -> list[str]:
    """Exact nearest neighbours (benchmarks/neighbours.py): the search's time, rate and memory."""
    lines = ["## Nearest neighbours", "", f"`{bench['command']}`", ""]
    for row in bench["rows"]:
        lines.append(
            f"- {row['queries']:,} proteins against {row['reference']:,} of width "
            f"{row['width']} on {row['device']}: {row['seconds']} s, "
            f"{row['reference_rows_per_second']:,} reference rows/s; peak memory "
            f"{row['peak_rss_gb_search']} GB for a reference of {row['reference_gb']} GB; a "
            f"sample equal to every distance: {'yes' if row['sample_equal_to_whole_matrix'] else 'NO'}"
        )
    return lines + failure_lines(bench) + [""]


def largest_lines(bench: dict) -> list[str]:
    lines = ["", "## The largest models", f"`{bench['command']}`", ""]
    rows = [r for r in bench["rows"] if "build_seconds" in r]
    lines += [big_line(r) for r in rows]
    lines += fp8_lines(rows)
    lines += failure_lines(bench)
    return lines


def big_line(row: dict) -> str:
    """A largest model's row (benchmarks/peers.py --big): its speed against its goal on the GPUs
    that have one, its peak memory, its error against fp32 (bf16's), and its build's and
    compile's seconds."""
    goal = ""
    if row["precision"] == "bf16" and row["model"] in BIG_GOALS:
        on = goal_on(row["device"], BIG_GOALS[row["model"]])
        goal = f" (goal on an {on[0]}: {on[1]:,})" if on else ""
    memory = (
        f", peak memory {row['peak_memory_bytes'] / 2**30:.1f} GiB"
        if row["peak_memory_bytes"] is not None
        else ""
    )
    error = (
        f"; per-residue cosine to fp32 {row['cosine_p1_vs_fp32']:.5f} at the 1st percentile"
        if "cosine_p1_vs_fp32" in row and not row["precision"].startswith("fp8")
        else ""
    )  # fp8's: fp8_lines
    return (
        f"\n{row['model']} ({row['layers']} layer{'s' * (row['layers'] != 1)}), {row['side']} "
        f"({row['precision']}): "
        f"{row['tokens_per_s']:,.0f} tokens/s{goal}{memory}{error}; built with random weights on "
        f"the device in {row['build_seconds']:.1f} s, compiled in {row['compile_seconds']:.1f} s."
    )


def fp8_lines(rows: list[dict]) -> list[str]:
    """FP8's rows (each recipe's: benchmarks/peers.py FP8_RECIPES) of the peers table or the
    largest models against their goals: its error, and its tokens/s over the same side's in
    bf16."""
    lines = []
    for row in (r for r in rows if r["precision"].startswith("fp8") and "cosine_p1_vs_fp32" in r
                and r["side"].endswith("compiled")):  # fmt: skip
        bf16 = [r for r in rows if r["model"] == row["model"] and r["side"] == row["side"]
                and r["precision"] == "bf16"]  # fmt: skip
        speed = (
            f"; {row['tokens_per_s'] / bf16[0]['tokens_per_s']:.2f}× bf16's tokens/s (goal "
            f"{FP8_GOALS['speedup']}×)"
            if bf16
            else ""
        )
        lines.append(
            f"\n{row['model']} in {row['precision']} against fp32: per-residue cosine "
            f"{row['cosine_p1_vs_fp32']:.5f} at the 1st percentile (goal "
            f"{FP8_GOALS['cosine_p1_vs_fp32']}), least protein's "
            f"{row['cosine_min_per_protein_vs_fp32']:.5f} (goal "
            f"{FP8_GOALS['cosine_min_per_protein_vs_fp32']}){speed}."
        )
    return lines


def unfinished(result: dict) -> str:
    return (
        f"Verdict: **unfinished**: stopped after {result['seconds']:.0f} s, the stages above done"
    )
