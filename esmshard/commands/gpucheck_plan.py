"""What `make gpu-check` runs, on a GPU and as its CPU stand-in, its stages, and the FP8 goals."""

from ..models import FAMILIES

PROTEOME = "ecoli_k12_UP000000625.fasta"
# What runs on a GPU, and the stand-in that exercises the same plumbing on a CPU. The whole runs
# take the whole proteome (the figures the docs quote); the benchmarks every `bench_every`-th
# protein (about 340k tokens: enough batches of the GPU's budget), so that the check takes
# minutes on one GPU.
GPU_PLAN = {
    "model": "esm2_t33_650M_UR50D",
    "esmc_model": "esmc_600m",  # a whole run of ESM C too
    # ProtT5-XL-U50's encoder (all 24 layers, random weights) against transformers' T5EncoderModel
    "t5_model": "prot_t5_xl_uniref50",
    "every": 1,
    "bench_every": 4,
    "toks_per_batch": 65536,
    "peers": ["--repeats", "2", "--no-big"],
    # the largest models (benchmarks/peers.py --big) on every 16th protein: a stage of its own,
    # last, so that a check cut short at a lent GPU's limit has everything else
    "largest": ["--esm2", "--esmc", "--big", "--big-every", "4"],
    # the whole model's masked marginals of every 400th protein up to 400 residues (11 proteins,
    # 723k forward tokens: about 2,600 of predict.py's passes)
    "masked": ["--device", "cuda", "--precision", "bf16", "--layers", "33", "--every", "400"]
    + ["--repeats", "1"],
    # exact nearest neighbours: 10,000 proteins against 1,000,000 of the 650M model's width
    "neighbours": ["--queries", "10000", "--reference", "1000000", "--device", "cuda"],
    # each one's forward pass in bf16 against its fp32 one: a GPU test
    # (tests/compute/test_families_on_devices.py)
    "families": [family.named for family in FAMILIES.values()],
}
CPU_PLAN = {
    "model": "esm2_t6_8M_UR50D",
    "esmc_model": None,
    "t5_model": None,
    "every": 100,
    "bench_every": 300,  # 15 proteins: fair-esm's fp32 loop is the slowest side on a CPU
    "toks_per_batch": 4096,
    # ESM C's peers on esmc_300m's first 2 layers: the same code, without building and saving
    # all 30 (10 s of the 33 on 2 cores); the sides on 3 proteins, one packed batch each: the
    # compiles are most of the stage's time on a CPU, and more proteins add shapes to compile
    "peers": ["--esm2", "esm2_t6_8M_UR50D", "--esmc", "esmc_300m", "--esmc-sequences", "2"]
    + ["--esmc-layers", "2", "--no-big", "--repeats", "1", "--threads", "2", "--every", "1500"],
    # the largest models' code on small stand-ins: their first layer, in bf16 (the peers
    # compile FP8's products already; each compile here is seconds of the CPU)
    "largest": ["--esm2", "--esmc", "--big", "--big-models", "esm2_t6_8M_UR50D", "esmc_300m"]
    + ["--big-layers", "1", "--big-every", "1", "--no-fp8", "--threads", "2", "--every", "1500"],
    "masked": ["--model", "esm2_t6_8M_UR50D", "--layers", "1", "--every", "2000", "--longest"]
    + ["200", "--repeats", "1", "--threads", "2"],
    "neighbours": ["--queries", "200", "--reference", "20000", "--device", "cpu", "--model"]
    + ["random:esm2_t6_8M_UR50D"],
    "families": GPU_PLAN["families"],
}


# FP8's goals (`precision: fp8`): its error against fp32, and its speed against bf16's
FP8_GOALS = {"cosine_p1_vs_fp32": 0.999, "cosine_min_per_protein_vs_fp32": 0.9997, "speedup": 1.3}


# The check's stages in the order it runs them, most telling first, so that a check cut short
# (a lent GPU's time limit) still has the figures that matter most; `--stages` runs some alone.
STAGES = ("tests", "whole-run", "masked-marginals", "peers", "throughput", "esmc-whole-run",
          "largest", "neighbours")  # fmt: skip
