"""Long proteins' scores through `snakemake` (`long_sequences: chunk`), against the published
recipes of the two references, written here from their papers' and repositories' descriptions
and checked once against the reference code itself (esm-variants' `esm_variants_utils.py`
`get_wt_LLR` and `get_intervals_and_weights`; ProteinGym's `compute_fitness.py` with
`scoring_window` `overlapping` and `optimal`, and `get_optimal_window`): the same windows and
weights, to 1e-12.

Real proteins: E. coli's, and slices of SARS-CoV-2's replicase polyprotein (7,096 residues) for
the longer ones; random weights of a micro ESM-2 (D = 32; 1 layer for the masked marginals, a pass of 1,024 tokens per
residue), fair-esm's own forward pass as the reference: the windows' arithmetic is what is
tested here (each family's forward pass has its own tests).
"""

import math
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from helpers import (
    LONG_PROTEIN,
    MODEL,
    PROTEOME,
    doc_block,
    fair_esm_model,
    fasta,
    progress_of,
    read_records,
    seeded_esm2,
    snakemake,
)

import esmshard
from esmshard.compute.embedder import SLOW_BATCHES_ENV
from esmshard.embeddings_h5.scores import AMINO_ACIDS

ESMSHARD = Path(sys.executable).parent / "esmshard"

WINDOW = 1022  # ESM-2's residues per window; 1,024 tokens with BOS and EOS
ECOLI = {h[1:].split()[0]: s for h, s in read_records(PROTEOME)}
POLYPROTEIN = read_records(LONG_PROTEIN)[0][1]
# 1,023 residues (a real protein's first), ~1,500, ~2,700 and ~4,700
PROTEINS = {
    "A2MG_first_1023": ECOLI["sp|P76578|A2MG_ECOLI"][:1023],
    "sp|P30015|LHR_ECOLI": ECOLI["sp|P30015|LHR_ECOLI"],
    "R1AB_first_2700": POLYPROTEIN[:2700],
    "R1AB_last_4700": POLYPROTEIN[-4700:],
}


def sigmoid(x):
    return 1 / (1 + math.exp(-x))


def esm_variants_log_probs(net, alphabet, sequence):
    """esm-variants' weighted windows: windows of 1,022 residues, one flush with each end, then
    pairs moving inwards 510 residues at a time while more than 1,022 lie between them, and a
    window on the middle of what is left if the last pair overlaps by fewer than 513; each
    window's log-softmax weighted by a ramp of 256 sigmoid steps (s = 20) at each end (not at
    the protein's own ends), the weights normalised per residue."""
    n, convert = len(sequence), alphabet.get_batch_converter()
    windows = []
    positions = np.arange(n)
    while len(positions) > WINDOW:
        windows += [positions[:WINDOW], positions[-WINDOW:]]
        positions = positions[510:-510]
    if windows[-2][-1] - windows[-1][0] < 512:
        middle = positions[len(positions) // 2]
        windows.append(np.arange(middle - 511, middle + 511))
    windows.sort(key=lambda w: w[0])
    up = np.array([sigmoid((t - 128) / 20) for t in range(256)])
    down = np.array([sigmoid(-(t - 128) / 20) for t in range(256)])
    total, weights = np.zeros((n, len(alphabet))), np.zeros(n)
    for k, window in enumerate(windows):
        weight = np.ones(WINDOW)
        if k > 0:
            weight[:256] = up
        if k < len(windows) - 1:
            weight[-256:] = down
        _, _, toks = convert([("w", sequence[window[0] : window[-1] + 1])])
        with torch.no_grad():
            logp = torch.log_softmax(net(toks)["logits"], -1)[0, 1:-1].double().numpy()
        total[window] += weight[:, None] * logp
        weights[window] += weight
    return total / weights[:, None]


def proteingym_log_probs(net, alphabet, sequence):
    """ProteinGym's overlapping slices of 1,024 tokens of [BOS, residues, EOS]: one from each
    end, moving inwards 511 tokens at a time until they cross, one more centred on the middle
    token if the last two overlap by fewer than 511; each weighted 1 but for sigmoid ramps
    (s = 16) over tokens 1-256 and 766-1,022, the weights normalised per token."""
    _, _, toks = alphabet.get_batch_converter()([("p", sequence)])
    size = toks.shape[1]
    weight = np.ones(1024)
    for i in range(1, 257):
        weight[i] = sigmoid((i - 128) / 16)
    for i in range(766, 1023):
        weight[i] = sigmoid(-(i - 1022 + 128) / 16)
    starts, left, right = [], 0, size - 1024
    while True:
        starts += [left, right]
        if left + 1023 > right:
            break
        left, right = left + 511, right - 511
    if left + 1023 - right + 1 < 511:
        starts.append(size // 2 - 512)
    total, weights = np.zeros((size, len(alphabet))), np.zeros(size)
    for start in starts:
        with torch.no_grad():
            logp = torch.log_softmax(net(toks[:, start : start + 1024])["logits"], -1)[0]
        total[start : start + 1024] += weight[:, None] * logp.double().numpy()
        weights[start : start + 1024] += weight
    return (total / weights[:, None])[1:-1]


@pytest.mark.parametrize("recipe", ["weighted", "overlapping"])
def test_every_substitution_of_long_proteins_equals_its_recipe(tmp_path, recipe):
    """`variants: all` over proteins of 1,023 to 4,700 residues: every row is the recipe's
    log-probability of the mutant minus the wild type's at its position (after averaging, as
    both references take it), within 1e-4; the logits kept are the recipe's."""
    fasta(tmp_path / "long.fasta", [(f">{name}", s) for name, s in PROTEINS.items()])
    config = {"input": "long.fasta", "model": MODEL, "outdir": "scan"}
    snakemake(tmp_path, config, "--config", "long_sequences=chunk", f"score_windows={recipe}",
              "variants=all", "variant_scoring=[wt_marginals]", "fast_path=false")  # fmt: skip
    net, alphabet = fair_esm_model(MODEL)
    columns = [alphabet.get_idx(a) for a in AMINO_ACIDS]
    of_recipe = esm_variants_log_probs if recipe == "weighted" else proteingym_log_probs
    rows = pq.read_table(tmp_path / "scan" / "variant_scores").to_pandas()
    with esmshard.open_embeddings(tmp_path / "scan" / "embeddings.h5") as emb:
        for name, sequence in PROTEINS.items():
            want = of_recipe(net, alphabet, sequence)[:, columns]
            np.testing.assert_allclose(emb[name].scores["logits"], want, atol=1e-4, rtol=0)
            mine = rows[rows["id"] == name]
            assert len(mine) == 19 * len(sequence)
            position = mine["mutant"].str[1:-1].astype(int).to_numpy() - 1
            mutant = [AMINO_ACIDS.index(m[-1]) for m in mine["mutant"]]
            wild = [AMINO_ACIDS.index(sequence[p]) for p in position]
            np.testing.assert_allclose(
                mine["wt_marginals"], want[position, mutant] - want[position, wild], atol=1e-4
            )
    if recipe == "weighted":
        looked_at_as_a_heatmap(tmp_path, "scan", "R1AB_last_4700")
        # the docs' command, as they show it
        (line,) = doc_block("docs/outputs.md", "esmshard heatmap OUTDIR ID").splitlines()
        subprocess.run(shlex.split(line), cwd=tmp_path, check=True, capture_output=True)
        assert (tmp_path / "lhr.png").stat().st_size > 0


def looked_at_as_a_heatmap(workdir, outdir, name):
    """`esmshard heatmap` of a 4,700-residue protein, the picture looked at: its size (19
    numbered rows of 248 positions, the last as full as the first), the colour scale once, above
    the rows, with both ends of the diverging scale, the wild type's black cell in each
    position (one of 20 cells: about a twentieth of the coloured area, the letters and numbers
    beside it), and one line for what it cannot draw, naming the ID meant."""
    import matplotlib.image as mpimg

    def heatmap(*args):
        return subprocess.run(["esmshard", "heatmap", *args], cwd=workdir, capture_output=True,
                              text=True)  # fmt: skip

    done = heatmap(outdir, name, "-o", "heat.png")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "wrote heat.png: positions 1 to 4,700 in 19 rows of up to 248\n"
    image = mpimg.imread(workdir / "heat.png")[..., :3]
    assert image.shape == (round(100 * (1.1 + 3.0 * 19)), 1500, 3)
    red = (image[..., 0] > 0.6) & (image[..., 2] < 0.45)
    blue = (image[..., 2] > 0.6) & (image[..., 0] < 0.45)
    coloured = (image.max(-1) - image.min(-1)) > 0.08
    black = image.max(-1) < 0.1
    assert red.sum() > 0.02 * coloured.sum() and blue.sum() > 0.02 * coloured.sum()
    assert 0.04 < black.sum() / coloured.sum() < 0.15
    # the scale: in the header alone, both of its ends there
    header, rows = slice(0, 110), slice(110, None)
    assert red[header].any() and blue[header].any()
    scale_columns = coloured[header].any(0)
    assert 0.3 < scale_columns.mean() < 0.6  # the middle of the width, not a row's
    # the rows share the positions: the last (236 of them) nearly as wide as the first (248)
    band = 300  # 3.0 inches at 100 dpi
    first, last = (coloured[110 + k * band : 110 + (k + 1) * band].any(0).sum() for k in (0, 18))
    assert 0.9 * first < last <= first, (first, last)
    assert coloured[rows].sum() > 0.5 * coloured.sum()
    for args, said in (
        ((outdir, "nosuch", "-o", "x.png"), "holds no protein 'nosuch'"),
        ((outdir, name.split("_", 1)[1].lower(), "-o", "x.png"), f"did you mean {name}?"),
        ((outdir, name, "-o", "x.jpg"), "x.jpg: give a file name ending .png or .svg"),
    ):
        done = heatmap(*args)
        assert done.returncode == 1 and len(done.stderr.splitlines()) == 1, done.stderr
        assert said in done.stderr and not (workdir / args[-1]).exists()


def micro_one_layer(folder):
    """A 1-layer micro ESM-2 (D = 32) with seeded random weights in fair-esm's format: a pass of
    1,024 tokens per residue stays cheap on a CPU."""
    from esmshard.models.esm2 import write_checkpoint

    return write_checkpoint(seeded_esm2(1, 32, seed=1), folder, "esm2_t1_micro")


def proteingym_masked(net, alphabet, sequence, residues):
    """ProteinGym's masked marginals with `scoring_window` `optimal`: each token of [BOS,
    residues, EOS] masked in turn, the model given the 1,024 tokens centred on it (starting
    512 before it), or the first or last 1,024 where it lies within 512 of an end; the
    log-softmax at the masked token. Returned for the `residues` (0-based) asked."""
    _, _, toks = alphabet.get_batch_converter()([("p", sequence)])
    size = toks.shape[1]
    rows = []
    for i in residues + 1:
        start = 0 if i < 512 else size - 1024 if i >= size - 512 else i - 512
        window = toks[0, start : start + 1024].clone()
        window[i - start] = alphabet.mask_idx
        rows.append((window, i - start))
    found = []
    for first in range(0, len(rows), 64):
        batch = rows[first : first + 64]
        with torch.no_grad():
            logp = torch.log_softmax(net(torch.stack([w for w, _ in batch]))["logits"], -1)
        found += [logp[k, at].double().numpy() for k, (_, at) in enumerate(batch)]
    return np.array(found)


def test_masked_marginals_of_a_long_protein_take_each_residues_optimal_window(tmp_path):
    """Masked marginals and the PLL of a 1,107-residue protein under `long_sequences: chunk`,
    and its variants' masked-marginal scores: ProteinGym's optimal window, within 1e-4."""
    name, sequence = "MSCM_ECOLI", ECOLI["sp|P39285|MSCM_ECOLI"]
    model = micro_one_layer(tmp_path / "weights")
    fasta(tmp_path / "long.fasta", [(f">{name}", sequence)])
    config = {"input": "long.fasta", "model": str(model), "outdir": "results"}
    snakemake(tmp_path, config, "--config", "long_sequences=chunk", "variants=all",
              "variant_scoring=[masked_marginals]", "include=[mean,pll]")  # fmt: skip
    # every ninth residue, and those on either side of where the window stops being flush
    # with an end (ProteinGym's three cases); the reference's passes cost a minute for all
    n = len(sequence)
    edges = [0, 509, 510, 511, 512, n - 513, n - 512, n - 511, n - 510, n - 1]
    residues = np.array(sorted(set(range(0, n, 9)) | set(edges)))
    net, alphabet = fair_esm_model(model)
    want = proteingym_masked(net, alphabet, sequence, residues)
    want = want[:, [alphabet.get_idx(a) for a in AMINO_ACIDS]]
    with esmshard.open_embeddings(tmp_path / "results" / "embeddings.h5") as emb:
        scores = emb[name].scores
    np.testing.assert_allclose(scores["masked_marginals"][residues], want, atol=1e-4, rtol=0)
    assert set(sequence) <= set(AMINO_ACIDS)
    wild = [AMINO_ACIDS.index(a) for a in sequence]
    own = scores["masked_marginals"][np.arange(n), wild]
    np.testing.assert_allclose(scores["pll"], [own.sum(), own.mean()], rtol=1e-5)
    rows = pq.read_table(tmp_path / "results" / "variant_scores").to_pandas()
    assert len(rows) == 19 * n
    rows = rows[rows["mutant"].str[1:-1].astype(int).isin(residues + 1)]
    at = np.searchsorted(residues, rows["mutant"].str[1:-1].astype(int).to_numpy() - 1)
    mutant = [AMINO_ACIDS.index(m[-1]) for m in rows["mutant"]]
    np.testing.assert_allclose(
        rows["masked_marginals"],
        want[at, mutant] - want[at, [wild[residues[k]] for k in at]],
        atol=1e-4,
    )


def test_a_stopped_masked_scan_of_a_long_protein_keeps_its_passes_and_the_same_command_ends_it(
    tmp_path,
):
    """LHR_ECOLI's every substitution (1,538 residues, `long_sequences=chunk`: a masked pass per
    residue) as the issue's user typed it, Ctrl-C once a third of its passes are done (its
    batches slowed, kept every second: a minute's scan at the default, shortened): the stop keeps
    the passes done, the progress and the same command go on from them, and the scores are an
    uninterrupted run's, bit for bit."""
    name = "sp|P30015|LHR_ECOLI"
    fasta(tmp_path / "lhr.fasta", [(f">{name}", PROTEINS[name])])
    model = micro_one_layer(tmp_path / "weights")
    typed = [str(ESMSHARD), "run", "lhr.fasta", "-o", "lhr", "--model", str(model),
             "--config", "variants=all", "long_sequences=chunk", "keep_every=1"]  # fmt: skip
    slow = {**os.environ, SLOW_BATCHES_ENV: "0.05"}

    def as_in_a_terminal():
        signal.signal(signal.SIGINT, signal.SIG_DFL)

    run = subprocess.Popen(typed, cwd=tmp_path, env=slow, stderr=subprocess.PIPE, text=True,
                           start_new_session=True, preexec_fn=as_in_a_terminal)  # fmt: skip
    passes = tmp_path / "lhr" / "store"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        shown = progress_of(tmp_path / "lhr")
        if shown.get("residues_done", 0) > len(PROTEINS[name]) / 3 and any(
            passes.glob("*/.pieces/*/passes-*.npz")
        ):
            break
        assert run.poll() is None, run.communicate()[1]
        time.sleep(0.05)
    assert 0 < shown["residues_done"] < len(PROTEINS[name])  # progress within the protein
    # the speed in passes and in their tokens (a pass of 1,024 tokens per residue)
    status = subprocess.run([str(ESMSHARD), "status", "lhr"], cwd=tmp_path, capture_output=True,
                            text=True).stdout  # fmt: skip
    speed = re.search(r" ([\d.]+)(k?) residues/s  \(([\d.]+)([kM]?) tokens/s of passes\)", status)
    assert speed, status
    per = {"": 1, "k": 1e3, "M": 1e6}
    ratio = float(speed[3]) * per[speed[4]] / (float(speed[1]) * per[speed[2]])
    assert 500 < ratio < 1100, status  # tokens per pass, about a window's
    os.killpg(run.pid, signal.SIGINT)
    said = run.communicate(timeout=120)[1]
    assert run.returncode == 130, said
    assert re.search(
        r"esmshard: stopped; 0 of 1 shards finished, [1-9][\d,]* of 1,538 residues", said
    )
    (log,) = (tmp_path / "lhr" / "logs" / "embed").glob("*.log")
    stopped = re.search(
        r"0 pieces and ([\d,]+) masked passes within proteins kept", log.read_text()
    )
    assert stopped, log.read_text()
    kept = int(stopped[1].replace(",", ""))
    assert len(PROTEINS[name]) / 3 <= kept < len(PROTEINS[name])

    again = subprocess.run(typed, cwd=tmp_path, capture_output=True, text=True)
    assert again.returncode == 0, again.stderr[-3000:]
    (log,) = (tmp_path / "lhr" / "logs" / "embed").glob("*.log")
    assert f"{kept:,} masked passes within 1 protein kept by an earlier job" in log.read_text()
    assert f"of 1,538 residues done ({kept:,} kept from stopped jobs); computing the rest" in (
        again.stderr
    )
    assert not any(passes.glob("*/.pieces"))  # gone with the part

    whole = subprocess.run([*typed[:4], "whole", *typed[5:]], cwd=tmp_path, capture_output=True,
                           text=True)  # fmt: skip
    assert whole.returncode == 0, whole.stderr[-3000:]
    with (
        esmshard.open_embeddings(tmp_path / "lhr" / "embeddings.h5") as resumed,
        esmshard.open_embeddings(tmp_path / "whole" / "embeddings.h5") as uninterrupted,
    ):
        for kind in ("masked_marginals", "logits"):
            got, want = resumed[name].scores.get(kind), uninterrupted[name].scores.get(kind)
            assert (got is None) == (want is None)
            if got is not None:
                np.testing.assert_array_equal(got, want)
    assert (tmp_path / "lhr" / "variant_scores.tsv").read_bytes() == (
        tmp_path / "whole" / "variant_scores.tsv"
    ).read_bytes()
