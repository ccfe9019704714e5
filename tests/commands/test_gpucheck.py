"""`make gpu-check`'s parts on a machine without CUDA: its Makefile route, its peers and stand-ins
(the whole check, in a GPU node's Python with the wheelhouse: tests/test_install.py)."""

import json
import os
import subprocess
import sys

import torch
from helpers import PROTEINS, REPO, clone_of_workflow, read_records

from esmshard.commands import gpucheck, gpucheck_markdown
from esmshard.compute.embedder import Embedder
from esmshard.compute.precision import PRECISIONS
from esmshard.models.archs import Arch
from esmshard.models.esmc import ALPHABET, ESMC, ffn_size
from esmshard.models.esmc_weights import Shape
from esmshard.models.layers import FastForward


def test_make_gpu_check_in_a_fresh_clone_builds_its_own_virtualenv_with_the_check_extra(tmp_path):
    """`make gpu-check` with no GPU_PYTHON: the clone's .venv with the gpu-check extra, then
    the check in it (the check itself runs in the GPU node's Python: tests/test_install.py)."""
    clone = clone_of_workflow(tmp_path / "esmshard")
    # a user's shell, not `make test`'s recipe: its make would have this one print its folder
    # and pass it its ARGS
    made = ("MAKEFLAGS", "MAKELEVEL", "MFLAGS", "ARGS")
    shell = {k: v for k, v in os.environ.items() if k not in made}
    done = subprocess.run(["make", "-n", "gpu-check"], cwd=clone, env=shell, capture_output=True,
                          text=True)  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = [line.strip() for line in done.stdout.splitlines()]
    assert lines[0] == "python3 -m venv .venv"
    extra = 'PYTHONWARNINGS="ignore:Compat editable installs" .venv/bin/python -m pip install --quiet --config-settings editable_mode=compat -e ".[gpu-check,cluster]"'
    assert extra in lines and lines.index(extra) < len(lines) - 2
    assert lines[-1].endswith(" .venv/bin/python -m esmshard.commands.gpucheck --out gpu-check")
    # given a Python, nothing is installed
    done = subprocess.run(["make", "-n", "gpu-check", "GPU_PYTHON=python3"], cwd=clone,
                          env=shell, capture_output=True, text=True)  # fmt: skip
    last = done.stdout.splitlines()[-1].strip()
    assert last.endswith(" python3 -m esmshard.commands.gpucheck --out gpu-check")
    assert "pip" not in done.stdout and "venv" not in done.stdout.replace(".venv/bin", "")


def test_a_missing_peer_package_is_one_line_and_the_other_sides_still_run(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "transformers", None)  # as if it were not installed
    (line,) = gpucheck.missing_packages().values()
    assert line == (
        "the peers (EsmModel, EsmcModel, T5) skipped: transformers is not installed "
        "(pip install 'esmshard[gpu-check]')"
    )
    assert "prot_t5_xl_uniref50" not in gpucheck.throughput_args(gpucheck.GPU_PLAN, True, False)
    # benchmarks/peers.py in a Python without transformers: one line per skipped peer
    script = (
        "import runpy, sys; sys.modules['transformers'] = None; "
        f"sys.path.insert(0, {str(REPO / 'benchmarks')!r}); "
        f"sys.argv = ['peers.py'] + {PEERS_ARGS!r}; "
        f"runpy.run_path({str(REPO / 'benchmarks' / 'peers.py')!r}, run_name='__main__')"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    skipped = [(r["skipped"], r["why"]) for r in rows if "skipped" in r]
    why = "transformers is not installed (pip install 'esmshard[gpu-check]')"
    assert skipped == [("transformers EsmModel (SDPA)", why), ("ESM C's peers", why)]
    sides = {r["side"] for r in rows if "tokens_per_s" in r}
    assert sides == {
        "fair-esm",
        "esmshard padded",
        "esmshard packed",
        "esmshard packed compiled",
    }


# the sides that need no peer package; FP8 is measured by the check itself (above)
PEERS_ARGS = ["--esm2", "esm2_t6_8M_UR50D", "--esmc", "esmc_300m", "--no-big", "--no-fp8"]
PEERS_ARGS += ["--repeats", "1", "--threads", "2", "--every", "1500", "--toks-per-batch", "4096"]


def recorded_page(tmp_path, tests: dict, **result) -> str:
    """The gpu-check.md that `record` writes of a CPU check whose GPU tests gave `tests` and
    whose other stages gave nothing (`result` sets the record's own fields)."""
    result = {
        "date": "2026-11-26", "environment": {**gpucheck.environment(), "gpu": False},
        "plan": gpucheck.CPU_PLAN, "stages": list(gpucheck.STAGES), "skipped": [],
        "tests": tests, "workflows": {}, "throughput": None, "peers": None,
        "masked_marginals": None, "largest": None, **result,
    }  # fmt: skip
    gpucheck.record(tmp_path, result, tmp_path / "results")
    return (tmp_path / "results" / "gpu-check.md").read_text()


def test_a_check_stopped_midway_keeps_what_it_measured_and_says_unfinished(tmp_path):
    # What a time limit leaves: the record as written after the GPU tests, the last stage done.
    tests = {"passed": 7, "failed": 0, "skipped": 0, "failures": [], "ok": True, "seconds": 25}
    page = recorded_page(tmp_path, tests, finished=False, ok=False, seconds=25.0)
    assert "7 passed, 0 failed, 0 skipped (25 s)" in page
    assert page.rstrip().endswith(
        "Verdict: **unfinished**: stopped after 25 s, the stages above done"
    )
    assert json.loads((tmp_path / "gpu-check.json").read_text())["finished"] is False


def test_gpu_tests_that_could_not_run_say_why_in_the_record(tmp_path):
    # A GPU machine without the test data: pytest stops in conftest before any test, and the
    # record said only "0 passed, 0 failed, 0 skipped".
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "conftest.py").write_text(
        "import pytest\n"
        "pytest.exit('the test data is missing and cannot be fetched: put r1ab_sars2.fasta "
        "into resources/test-data', returncode=3)\n"
    )
    (suite / "test_nothing.py").write_text("def test_nothing():\n    pass\n")
    tests = gpucheck.run_tests(tmp_path, suite)
    assert not tests["ok"] and tests["passed"] == 0
    assert tests["error"].startswith("the test data is missing and cannot be fetched")
    page = recorded_page(tmp_path, tests, stages=["tests"], finished=True, ok=False, seconds=2.0)
    assert "They did not run: the test data is missing and cannot be fetched: put " in page


def test_only_the_files_that_mark_gpu_tests_are_collected(tmp_path):
    # A file without GPU tests is not even imported: one that fails to import goes unnoticed.
    suite = tmp_path / "suite"
    (suite / "compute").mkdir(parents=True)
    (suite / "compute" / "test_on_gpu.py").write_text(
        "import pytest\n\n@pytest.mark.gpu\ndef test_a():\n    pass\n\ndef test_b():\n    pass\n"
    )
    (suite / "test_cpu.py").write_text("raise ImportError('collected')\n")
    tests = gpucheck.run_tests(tmp_path, suite)
    assert tests["ok"] and (tests["passed"], tests["skipped"], tests["failed"]) == (1, 0, 0)
    assert gpucheck.gpu_test_files(suite / "compute") == [str(suite / "compute/test_on_gpu.py")]
    (suite / "compute" / "test_on_gpu.py").unlink()
    assert gpucheck.gpu_test_files(suite) == [str(suite)]  # none marked: pytest finds none


def test_a_gpu_runs_record_goes_where_git_keeps_it():
    # The records are committed as they come back: a folder that git ignores would drop them.
    env = {"gpu": True, "device": "NVIDIA H100 80GB HBM3"}
    folder = gpucheck.results_folder(env, "2026-01-01")
    assert folder.parent == REPO / "benchmarks" / "results"
    assert folder.name.startswith("2026-01-01-NVIDIA-H100-80GB-HBM3")
    ignored = subprocess.run(
        ["git", "check-ignore", "-q", str(folder / "gpu-check.json")], cwd=REPO
    )
    assert ignored.returncode == 1, f"git ignores {folder}"


def test_the_peers_eager_side_stays_eager_where_the_model_is_its_own_forward_pass(monkeypatch):
    # ESM C's model is its forward pass, so each esmshard side of it shares one net: the compiled
    # side's layer, left attached, ran under the eager side too and made compiling look worthless.
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    import peers

    torch.manual_seed(0)
    net = ESMC(Shape(Arch(2, 64, 4), ffn_size(64))).eval()
    cpu, fp32 = torch.device("cpu"), PRECISIONS["fp32"]
    eager, fast = (
        Embedder(net, ALPHABET, [2], cpu, fp32, kinds=["mean"], packed=True) for _ in range(2)
    )
    sequences = [seq[:200] for _, seq in read_records(PROTEINS)[:4]]
    batches = [[0, 1], [2, 3]]
    run_compiled, layer = peers.compiled_side(fast, sequences, batches, "ESM C", "fp32")
    compiled_blocks = []
    run_block = FastForward.run_block

    def spy(self, *args):
        compiled_blocks.append(self.compiled_block is not None)
        return run_block(self, *args)

    monkeypatch.setattr(FastForward, "run_block", spy)
    peers.esmshard_side(eager, sequences, batches)()
    assert compiled_blocks and not any(compiled_blocks)
    compiled_blocks.clear()
    run_compiled()
    assert compiled_blocks and all(compiled_blocks)
    layer.finish()


def test_a_profiles_kernels_fall_in_the_classes_the_gpu_work_is_planned_by(monkeypatch):
    """benchmarks/peers.py --profile: the kernels an H200's profile of t33 named (its record,
    eager and compiled, bf16), each in its class; then a line of the record, class by class."""
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    import peers

    kernels = {
        "nvjet_sm90_tst_128x248_64x4_2x1_v_bz_coopA_bias_TNT": "products",
        "nvjet_sm90_tst_192x208_64x4_1x2_h_bz_coopB_gelubias_TNT": "products",  # GELU in it
        "aten::_addmm_activation": "products",
        "mkldnn::_linear_pointwise": "products",  # a CPU's, through oneDNN
        "aten::mm": "products",
        "aten::_scaled_mm": "products",  # FP8's
        "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_tra...": "attention",
        "aten::_scaled_dot_product_flash_attention_for_cpu": "attention",
        "triton_red_fused__to_copy_add_native_layer_norm_0": "norms",
        # the record's table cuts names short; the profile's events hold them whole
        "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, "
        "float>(int, float, c10::BFloat16 const*, c10::BFloat16 const*, c10::BFloat16 const*, "
        "float*, float*, c10::BFloat16*)": "norms",
        "triton_red_fused__to_copy_abs_amax_clamp_div_gelu_0": "FP8 quantization",
        "triton_poi_fused_gelu_2": "activation",
        "triton_poi_fused_add_cat_mul_neg_split_view_1": "element-wise and copies",  # rotary
        "void at::native::(anonymous namespace)::CatArrayBatchedCo...": "element-wise and copies",
        "aten::addcmul_": "element-wise and copies",
    }
    assert {name: peers.kernel_class(name) for name in kernels} == kernels
    record = (REPO / "benchmarks/results/2026-11-29-NVIDIA-H200/profile.txt").read_text()
    assert all(name.split("<")[0] in record for name in list(kernels)[:3] + list(kernels)[6:7])

    row = {
        "model": "esm2_t33_650M_UR50D", "side": "esmshard packed compiled", "precision": "bf16",
        "profiled_seconds": 1.089, "device_busy_share": 0.9, "host_gap_seconds": 0.109,
        "seconds_by_class": {"products": 0.652, "attention": 0.150, "norms": 0.118,
                             "FP8 quantization": 0.0, "activation": 0.0,
                             "element-wise and copies": 0.0606},
    }  # fmt: skip
    assert gpucheck_markdown.profiled_line(row) == (
        "- esm2_t33_650M_UR50D, esmshard packed compiled (bf16): 1.09 s, the device busy 90% of "
        "it: products 0.652 s (60%), attention 0.150 s (14%), norms 0.118 s (11%), host gaps "
        "0.109 s (10%), element-wise and copies 0.061 s (6%)"
    )


def test_the_gpu_plans_whole_run_is_set_against_its_goal_on_the_gpus_that_have_one():
    run = {
        "command": "snakemake ...", "shards": 1, "sequences": 4403, "tokens": 1_346_422,
        "devices": ["NVIDIA H200"], "precisions": ["bf16"], "load_seconds": 6.8,
        "whole_shard_tokens_per_s_with_loading": 112_345.6,
        "whole_shard_tokens_per_s_loaded": 240_000.0, "compile_seconds": 0.0,
        "compile_cache": ["off"], "whole_shard_tokens_per_s_compiled": 240_000.0,
        "host_fraction": 0.05, "telemetry_samples": 30, "mean_utilization_percent": 80.0,
        "checks": {"esmshard status shows the finished run": True},
    }  # fmt: skip
    page = "\n".join(gpucheck_markdown.whole_run_lines(gpucheck.GPU_PLAN["model"], run))
    assert (
        "on NVIDIA H200 (bf16)" in page
        and "once loaded (read-back and writing included); not compiled; " in page
    )
    assert "\nWith loading on an H200: 112,346 tokens/s (goal 150,000).\n\n- [x] esmshard" in page
    cpu = {**run, "devices": ["cpu"]}  # the CPU plan's small model has no goal
    assert "goal" not in "\n".join(
        gpucheck_markdown.whole_run_lines(gpucheck.CPU_PLAN["model"], cpu)
    )


def test_the_largest_models_are_set_against_their_goals_on_the_gpus_that_have_one():
    row = {
        "model": "esm2_t48_15B_UR50D", "layers": 48, "side": "esmshard packed compiled",
        "precision": "bf16", "device": "NVIDIA H200", "tokens_per_s": 18_123.4,
        "peak_memory_bytes": 35.25 * 2**30, "build_seconds": 1.23, "compile_seconds": 14.04,
        "cosine_p1_vs_fp32": 0.999981, "cosine_min_per_protein_vs_fp32": 0.999994,
    }  # fmt: skip
    assert gpucheck_markdown.big_line(row) == (
        "\nesm2_t48_15B_UR50D (48 layers), esmshard packed compiled (bf16): 18,123 tokens/s "
        "(goal on an H200: 17,000), peak memory 35.2 GiB; per-residue cosine to fp32 0.99998 at "
        "the 1st percentile; built with random weights on the device in 1.2 s, compiled in "
        "14.0 s."
    )
    h100 = gpucheck_markdown.big_line({**row, "device": "NVIDIA H100 80GB HBM3"})
    assert "(goal on an H100: 15,300)" in h100
    for other in ({"precision": "fp8"}, {"device": "NVIDIA A100-SXM4-80GB"}):
        assert "goal" not in gpucheck_markdown.big_line({**row, **other})
    # each FP8 recipe's error and speed against its goals, beside its model's bf16 row
    fp8 = {**row, "precision": "fp8-feed-forward", "tokens_per_s": 21_748.1,
           "cosine_p1_vs_fp32": 0.99951, "cosine_min_per_protein_vs_fp32": 0.99968}  # fmt: skip
    page = "\n".join(gpucheck_markdown.largest_lines(
        {"command": "python benchmarks/peers.py --big", "rows": [row, fp8], "error": None}))  # fmt: skip
    assert "per-residue cosine to fp32" not in page.split("(fp8-feed-forward): ")[1]
    assert page.endswith(
        "\nesm2_t48_15B_UR50D in fp8-feed-forward against fp32: per-residue cosine 0.99951 at "
        "the 1st percentile (goal 0.999), least protein's 0.99968 (goal 0.9997); 1.20× bf16's "
        "tokens/s (goal 1.3×)."
    )


def test_stages_run_alone_say_so_and_leave_the_others_out(tmp_path):
    """`esmshard gpu-check --stages ...` (a lent GPU's time limit: the largest models in a second
    call): only those run, and the page says which. On a CPU ESM C's whole run is the GPU plan's:
    nothing to run, quickly."""
    out = tmp_path / "check"
    done = subprocess.run(["esmshard", "gpu-check", "--out", str(out), "--stages",
                           "esmc-whole-run"], capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = json.loads((out / "gpu-check.json").read_text())
    assert result["stages"] == ["esmc-whole-run"] and result["ok"] and result["finished"]
    assert result["tests"] is result["peers"] is result["largest"] is None
    assert result["workflows"] == {}
    page = (out / "gpu-check.md").read_text()
    assert "Stages: esmc-whole-run (of tests, whole-run, masked-marginals, peers," in page
    assert "Verdict: **pass**" in page


def test_the_neighbours_stage_says_its_rate_its_memory_and_its_check(tmp_path):
    row = {"queries": 10000, "reference": 1000000, "width": 1280, "k": 10, "device": "cuda",
           "seconds": 12.5, "reference_rows_per_second": 80000, "pairs_per_second": 8 * 10**8,
           "reference_gb": 5.12, "peak_rss_gb_before_search": 0.4, "peak_rss_gb_search": 1.1,
           "sample_equal_to_whole_matrix": True}  # fmt: skip
    bench = {"command": "python benchmarks/neighbours.py --queries 10000", "ok": True,
             "seconds": 60.0, "rows": [row], "error": None}  # fmt: skip
    page = recorded_page(tmp_path, None, neighbours=bench, finished=True, ok=True, seconds=60.0)
    assert (
        "- 10,000 proteins against 1,000,000 of width 1280 on cuda: 12.5 s, 80,000 reference "
        "rows/s; peak memory 1.1 GB for a reference of 5.12 GB; a sample equal to every "
        "distance: yes"
    ) in page
    # a stage that failed shows what the benchmark printed last, as every stage does
    failed = {**bench, "ok": False, "rows": [], "error": "torch.OutOfMemoryError: CUDA out of"}
    page = gpucheck_markdown.neighbours_lines(failed)
    assert page[-5:] == ["The benchmark failed:", "```", failed["error"], "```", ""]
