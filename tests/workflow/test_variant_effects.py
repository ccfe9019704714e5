"""Scores and variant effects through `snakemake`, as users type them: real proteins, random
weights in fair-esm's on-disk format, fair-esm's own forward pass and predict.py's `label_row`
arithmetic as the reference."""

import csv
import gzip
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from helpers import (
    PROTEOME,
    WITHOUT_TEST_EXTRAS,
    config_check,
    doc_block,
    fair_esm_model,
    fasta,
    jobs_run,
    read_records,
    snakemake,
    the_one_refusal,
)

import esmshard
from esmshard.embeddings_h5.scores import AMINO_ACIDS

# Short real proteins: a forward pass per residue each.
RECORDS = [r for r in read_records(PROTEOME) if 30 <= len(r[1]) <= 70][:5]
IDS = [h[1:].split()[0] for h, _ in RECORDS]
SEQUENCE = dict(zip(IDS, (s for _, s in RECORDS)))
SCORING = ["variant_scoring=[wt_marginals,masked_marginals]", "include=[mean,pll]"]


def variants_table(path):
    """Single and multiple substitutions over three of the proteins, ProteinGym's extra column."""
    rows = []
    for id_ in IDS[:3]:
        s = SEQUENCE[id_]
        rows.append((id_, f"{s[2]}3{'A' if s[2] != 'A' else 'C'}"))
        rows.append((id_, f"{s[4]}5W:{s[9]}10{'G' if s[9] != 'G' else 'D'}"))
    with open(path, "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["id", "mutant", "DMS_score"])
        writer.writerows((id_, mutant, 0.5) for id_, mutant in rows)
    return rows


@pytest.fixture(scope="module")
def run(tmp_path_factory, checkpoint):
    workdir = tmp_path_factory.mktemp("variants")
    fasta(workdir / "proteins.fasta", RECORDS)
    rows = variants_table(workdir / "variants.csv")
    config = {"input": "proteins.fasta", "model": str(checkpoint), "outdir": "results"}
    done = snakemake(workdir, config, "--config", "variants=variants.csv", *SCORING)
    return workdir, config, rows, done


@pytest.fixture(scope="module")
def fair_esm(checkpoint):
    """fair-esm's model from the checkpoint file, and per protein: the log-softmax of its
    logits, and with each position masked (predict.py's two strategies)."""
    net, alphabet = fair_esm_model(checkpoint)
    found = {}
    for id_, sequence in SEQUENCE.items():
        _, _, toks = alphabet.get_batch_converter()([(id_, sequence)])
        with torch.no_grad():
            logits = torch.log_softmax(net(toks)["logits"], -1)[0]
            copies = toks.repeat(len(sequence), 1)
            positions = torch.arange(len(sequence)) + 1
            copies[torch.arange(len(sequence)), positions] = alphabet.mask_idx
            masked = torch.log_softmax(net(copies)["logits"], -1)[
                torch.arange(len(sequence)), positions
            ]
        masked = torch.cat([logits[:1], masked])  # row 1 + i is residue i, as in logits
        found[id_] = (logits.numpy(), masked.numpy())
    return alphabet, found


def label_row(row, sequence, token_probs, alphabet):
    """fair-esm's examples/variant-prediction/predict.py, its arithmetic as written there."""
    score = 0
    for row in row.split(":"):
        wt, idx, mt = row[0], int(row[1:-1]) - 1, row[-1]
        assert sequence[idx] == wt, "The listed wildtype does not match the provided sequence"
        wt_encoded, mt_encoded = alphabet.get_idx(wt), alphabet.get_idx(mt)
        score += token_probs[1 + idx, mt_encoded] - token_probs[1 + idx, wt_encoded]
    return score


def test_variant_scores_are_predict_py_label_row(run, fair_esm):
    workdir, _, rows, done = run
    alphabet, reference = fair_esm
    with open(workdir / "results" / "variant_scores.tsv", newline="") as fh:
        got = list(csv.DictReader(fh, delimiter="\t"))
    assert [(r["id"], r["mutant"]) for r in got] == rows
    # the table's own columns kept, in its order, the strategies' after them
    assert list(got[0]) == ["id", "mutant", "DMS_score", "wt_marginals", "masked_marginals"]
    assert {r["DMS_score"] for r in got} == {"0.5"}
    for r in got:
        logits, masked = reference[r["id"]]
        sequence = SEQUENCE[r["id"]]
        want = label_row(r["mutant"], sequence, logits, alphabet)
        assert abs(float(r["wt_marginals"]) - want) <= 1e-4, r
        want = label_row(r["mutant"], sequence, masked, alphabet)
        assert abs(float(r["masked_marginals"]) - want) <= 1e-4, r
    # the same rows as a Parquet dataset
    table = pq.read_table(workdir / "results" / "variant_scores").to_pylist()
    assert [(t["id"], t["mutant"]) for t in table] == sorted(rows, key=lambda r: r[0])  # by id
    assert "variant_scores.tsv" in done.stderr  # the closing lines name it


def test_stored_scores_equal_fair_esm_forward_pass_and_the_pll_their_sum(run, fair_esm):
    workdir, *_ = run
    alphabet, reference = fair_esm
    columns = [alphabet.get_idx(a) for a in AMINO_ACIDS]
    with esmshard.open_embeddings(workdir / "results" / "embeddings.h5") as emb:
        assert sorted(emb.unlayered) == ["logits", "masked_marginals", "pll"]  # the strategies'
        h5 = emb.h5  # each score's columns named where h5py alone reads them
        assert list(h5["logits/values"].attrs["columns"]) == list(AMINO_ACIDS)
        assert list(h5["masked_marginals/values"].attrs["columns"]) == list(AMINO_ACIDS)
        assert list(h5["pll/values"].attrs["columns"]) == ["pll", "pll_per_residue"]
        for id_, sequence in SEQUENCE.items():
            logits, masked = reference[id_]
            n = len(sequence)
            got = emb[id_].scores
            # rtol: random weights put log-probabilities near -50 to -80 (a trained model's
            # within about -20), where fp32 rounds more coarsely: fair-esm's own pass moves
            # them by up to 7.6e-5 between its copies batched and one at a time (AVX-512)
            np.testing.assert_allclose(
                got["logits"], logits[1 : n + 1, columns], atol=1e-4, rtol=2e-6
            )
            np.testing.assert_allclose(
                got["masked_marginals"], masked[1 : n + 1, columns], atol=1e-4, rtol=2e-6
            )
            at_residues = got["masked_marginals"][
                np.arange(n), [AMINO_ACIDS.index(a) for a in sequence]
            ]
            np.testing.assert_allclose(
                got["pll"], [at_residues.sum(), at_residues.mean()], rtol=1e-5
            )


def test_every_substitution_is_scored_from_the_store_computing_nothing(run):
    workdir, config, *_ = run
    done = snakemake(workdir, config, "--config", "variants=all", *SCORING)
    assert jobs_run(done) == {"variants": 1}  # no shard, embed or merge job
    with open(workdir / "results" / "variant_scores.tsv", newline="") as fh:
        got = list(csv.DictReader(fh, delimiter="\t"))
    for id_, sequence in SEQUENCE.items():
        mine = [r["mutant"] for r in got if r["id"] == id_]
        assert len(mine) == 19 * len(sequence)
        assert mine[:2] == [f"{sequence[0]}1{a}" for a in AMINO_ACIDS if a != sequence[0]][:2]
    # the records in order of their IDs, each record's rows together
    firsts = [r["id"] for k, r in enumerate(got) if k == 0 or got[k - 1]["id"] != r["id"]]
    assert firsts == sorted(SEQUENCE)


def test_a_variant_that_does_not_fit_its_record_stops_the_run_before_any_job(tmp_path, run):
    workdir, config, *_ = run
    sequence = SEQUENCE[IDS[0]]
    wrong = next(a for a in AMINO_ACIDS if a != sequence[6])
    (tmp_path / "bad.tsv").write_text(f"id\tmutant\n{IDS[0]}\t{wrong}7A\n")
    # the Snakefile's own path of the variants' refusals (the others: by what it calls)
    done = snakemake(
        workdir, config, "--config", f"variants={tmp_path / 'bad.tsv'}", *SCORING, check=False
    )
    assert done.returncode == 2
    said = [line for line in done.stderr.splitlines() if line.startswith("esmshard:")]
    assert said == [
        f"esmshard: variants: {tmp_path / 'bad.tsv'}:2: {wrong}7A: the record has "
        f"{sequence[6]} at 7, not {wrong}; positions count from 1 in the record's sequence "
        "(variant_offset)"
    ]


def test_a_table_saved_by_excel_is_read_as_the_same_table(tmp_path, checkpoint):
    """Excel's "CSV UTF-8": a byte-order mark before `id`, lines ending CRLF; the same rows and
    scores as the plain table, from the store (nothing computed again)."""
    fasta(tmp_path / "proteins.fasta", RECORDS[:3])
    variants_table(tmp_path / "variants.csv")
    excel = tmp_path / "variants from excel.csv"
    excel.write_bytes(b"\xef\xbb\xbf" + (tmp_path / "variants.csv").read_bytes().replace(
        b"\r\n", b"\n").replace(b"\n", b"\r\n"))  # fmt: skip
    config = {"input": "proteins.fasta", "model": str(checkpoint), "store": "store"}
    snakemake(tmp_path, config, "--config", "variants=variants.csv", "outdir=plain", *SCORING)
    done = snakemake(tmp_path, config, "--config", f"variants={excel}", "outdir=excel", *SCORING)
    assert jobs_run(done).get("embed", 0) == 0
    want = (tmp_path / "plain" / "variant_scores.tsv").read_text()
    assert (tmp_path / "excel" / "variant_scores.tsv").read_text() == want


def test_the_last_line_says_how_many_variants_have_no_row_and_why(tmp_path):
    """`esmshard run` with a variants table whose records partly fail (each too large for the
    device, provoked): its last line of esmshard's counts the variants left without a row."""
    fasta(tmp_path / "proteins.fasta", RECORDS[:3])
    variants_table(tmp_path / "variants.csv")
    limit = sorted(len(SEQUENCE[id_]) for id_ in IDS[:3])[0] + 2  # the shortest alone fits
    failing = sum(len(SEQUENCE[id_]) + 2 > limit for id_ in IDS[:3])
    done = subprocess.run(
        ["esmshard", "run", "proteins.fasta", "-o", "out", "--model", "random:esm2_t6_8M_UR50D",
         "--config", "variants=variants.csv", "variant_scoring=[wt_marginals,masked_marginals]"],
        cwd=tmp_path, capture_output=True, text=True,
        env={**ENV, "ESMSHARD_INJECT_OOM_TOKENS": str(limit)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    ours = [line for line in done.stderr.splitlines() if line.startswith("esmshard:")]
    assert ours[-1] == (
        f"esmshard: variants: {2 * (3 - failing)} scored (wt_marginals, masked_marginals) in "
        f"out/variant_scores.tsv; {2 * failing} variants have no row: their records failed "
        "(failed_sequences.tsv says why)"
    )
    assert done.stderr.splitlines()[-1].startswith("esmshard run: Snakemake's whole output is in")
    rows = (tmp_path / "out" / "variant_scores.tsv").read_text().splitlines()
    assert len(rows) == 1 + 2 * (3 - failing)


def test_a_stop_gain_is_the_least_score_from_its_position_to_the_end(tmp_path, run, fair_esm):
    """`K17*` (esm-variants' `get_minLLR`, written here from its recipe and checked once against
    its code: the least log p(a) − log p(wild type) over the 20 amino acids at every position
    from the stop's to the end), under both strategies; pseudo_ppl, which has no mutant
    sequence for it, leaves its cell empty and the last line counts it."""
    workdir, config, *_ = run
    alphabet, reference = fair_esm
    columns = [alphabet.get_idx(a) for a in AMINO_ACIDS]
    id_ = IDS[1]
    sequence = SEQUENCE[id_]
    stop = f"{sequence[16]}17*"
    table = tmp_path / "stops.csv"
    table.write_text(
        f"id,mutant\n{id_},{stop}\n{id_},{sequence[2]}3{'A' if sequence[2] != 'A' else 'C'}\n"
    )
    done = snakemake(workdir, {**config, "outdir": str(tmp_path / "out")}, "--config",
                     f"variants={table}", "include=[mean,pll]",
                     "variant_scoring=[wt_marginals,masked_marginals,pseudo_ppl]")  # fmt: skip
    with open(tmp_path / "out" / "variant_scores.tsv", newline="") as fh:
        got = list(csv.DictReader(fh, delimiter="\t"))
    assert [r["mutant"] for r in got] == [stop, got[1]["mutant"]]
    for name, matrix in zip(["wt_marginals", "masked_marginals"], reference[id_]):
        logp = matrix[1 : len(sequence) + 1][:, columns]
        wild = logp[np.arange(len(sequence)), [AMINO_ACIDS.index(a) for a in sequence]]
        want = (logp - wild[:, None])[16:].min()
        assert abs(float(got[0][name]) - want) <= 1e-4, (name, got[0][name], want)
    assert got[0]["pseudo_ppl"] == "" and got[1]["pseudo_ppl"] != ""
    parquet = pq.read_table(tmp_path / "out" / "variant_scores").to_pylist()
    assert parquet[0]["pseudo_ppl"] is None and parquet[1]["pseudo_ppl"] is not None
    ours = [line for line in done.stderr.splitlines() if line.startswith("esmshard: variants")]
    assert ours[-1].endswith("; left empty where a strategy cannot score the row: pseudo_ppl 1")


def test_a_dms_table_numbered_from_another_residue_comes_back_whole_with_its_model_named(
    tmp_path, run, checkpoint
):
    """A ProteinGym-style table whose positions count from 3 (`variant_offset=3`, predict.py's
    `--offset-idx 3`): its own columns come back in its order, its scores equal the table's
    numbered from 1, and the Parquet dataset (read by name by pyarrow and Polars) and
    `variant_scores.json` name the model. With the
    default offset, one line before any job names the offset at which it fits."""
    workdir, config, rows, _ = run
    table = tmp_path / "ambler.csv"
    with open(table, "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["mutant", "DMS_score", "DMS_score_bin", "id"])
        for k, (id_, mutant) in enumerate(rows):
            shifted = ":".join(f"{m[0]}{int(m[1:-1]) + 2}{m[-1]}" for m in mutant.split(":"))
            writer.writerow([shifted, f"{k / 10}", k % 2, id_])
    said = config_check(workdir, config, "--config", f"variants={table}", *SCORING)
    assert the_one_refusal(said).endswith("set variant_offset=3")
    outdir = tmp_path / "out"
    store = str(workdir / "results" / "store")  # the first run's: nothing computed again
    done = snakemake(workdir, {**config, "outdir": str(outdir), "store": store}, "--config",
                     f"variants={table}", "variant_offset=3", *SCORING)  # fmt: skip
    assert jobs_run(done).get("embed", 0) == 0
    with open(outdir / "variant_scores.tsv", newline="") as fh:
        got = list(csv.DictReader(fh, delimiter="\t"))
    # the module's table, numbered from 1, scored from the same store (later tests rewrite
    # the module's own results)
    plain = tmp_path / "plain"
    snakemake(workdir, {**config, "outdir": str(plain), "store": store}, "--config",
              "variants=variants.csv", *SCORING)  # fmt: skip
    with open(plain / "variant_scores.tsv", newline="") as fh:
        numbered_from_1 = list(csv.DictReader(fh, delimiter="\t"))
    assert list(got[0]) == ["mutant", "DMS_score", "DMS_score_bin", "id", "wt_marginals",
                            "masked_marginals"]  # fmt: skip
    for mine, plain in zip(got, numbered_from_1, strict=True):
        assert mine["id"] == plain["id"]
        for name in ("wt_marginals", "masked_marginals"):
            assert mine[name] == plain[name]
    parquet = pq.read_table(outdir / "variant_scores")
    assert parquet.schema.field("DMS_score").type == "double"
    made_by = json.loads(parquet.schema.metadata[b"esmshard"])
    assert made_by["model"] == str(checkpoint) and made_by["variant_offset"] == 3
    assert made_by["weights_sha256"] and made_by["settings_key"]
    summary = json.loads((outdir / "variant_scores.json").read_text())
    assert summary["made_by"] == made_by and summary["counts"]["scored"] == len(got)
    import polars as pl

    assert pl.read_parquet(outdir / "variant_scores").height == len(got)
    # its heatmap numbers the positions as the table does
    shown = subprocess.run(["esmshard", "heatmap", "out", got[0]["id"], "-o", "h.png"],
                           cwd=tmp_path, capture_output=True, text=True)  # fmt: skip
    length = len(SEQUENCE[got[0]["id"]])
    assert shown.stdout.startswith(f"wrote h.png: positions 3 to {length + 2:,} in "), shown
    dms = {(r["id"], r["mutant"]): float(r["DMS_score"]) for r in got}
    assert {(r["id"], r["mutant"]): r["DMS_score"] for r in parquet.to_pylist()} == dms
    # the docs' Spearman correlation against the table's own scores, typed as they show it
    code = doc_block("docs/outputs.md", "a Spearman correlation", "```python\n")
    shown = subprocess.run([sys.executable, "-c", WITHOUT_TEST_EXTRAS + code], cwd=tmp_path,
                           capture_output=True, text=True, check=True)  # fmt: skip
    ranks = [
        np.argsort(np.argsort([float(r[column]) for r in got]))
        for column in ("masked_marginals", "DMS_score")
    ]
    assert abs(float(shown.stdout) - np.corrcoef(*ranks)[0, 1]) < 1e-9
    # the docs' join with an AlphaMissense-style table (its own comment lines first), as shown
    catalogue = [(r["id"].split("|")[1], r["mutant"], k / 7) for k, r in enumerate(got)]
    with gzip.open(tmp_path / "AlphaMissense_aa_substitutions.tsv.gz", "wt") as fh:
        fh.write("# Copyright notice, as the real file opens\n")
        fh.write("uniprot_id\tprotein_variant\tam_pathogenicity\tam_class\n")
        fh.writelines(f"{u}\t{v}\t{p}\tambiguous\n" for u, v, p in catalogue)
    code = doc_block("docs/outputs.md", "AlphaMissense's", "```python\n")
    shown = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                           text=True, check=True)  # fmt: skip
    ranks = [np.argsort(np.argsort(v)) for v in ([float(r["masked_marginals"]) for r in got],
                                                 [p for *_, p in catalogue])]  # fmt: skip
    assert abs(float(shown.stdout) - np.corrcoef(*ranks)[0, 1]) < 1e-9


ENV = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}


def test_an_ensemble_is_the_mean_of_its_runs(tmp_path, run):
    workdir, *_ = run
    results = workdir / "results"
    doubled = tmp_path / "second"
    doubled.mkdir()
    with (
        open(results / "variant_scores.tsv") as fh,
        open(doubled / "variant_scores.tsv", "w") as out,
    ):
        lines = fh.read().splitlines()
        out.write(lines[0] + "\n")
        for line in lines[1:]:
            id_, mutant, dms, *values = line.split("\t")
            tripled = (str(3 * float(v)) for v in values)
            out.write("\t".join([id_, mutant, dms, *tripled]) + "\n")
    done = subprocess.run(
        ["esmshard", "ensemble", str(results), str(doubled), "--out", str(tmp_path / "mean.tsv")],
        capture_output=True,
        text=True,
        env=ENV,
    )
    assert done.returncode == 0, done.stderr
    mean = [line.split("\t") for line in (tmp_path / "mean.tsv").read_text().splitlines()]
    first = [line.split("\t") for line in lines]
    assert [m[:3] for m in mean] == [f[:3] for f in first]  # id, mutant, DMS_score
    for m, f in zip(mean[1:], first[1:]):
        np.testing.assert_allclose(
            [float(v) for v in m[3:]], [2 * float(v) for v in f[3:]], rtol=1e-6
        )
    lines[1] = lines[1].replace(lines[1].split("\t")[1], "A1C")
    (doubled / "variant_scores.tsv").write_text("\n".join(lines) + "\n")
    done = subprocess.run(
        ["esmshard", "ensemble", str(results), str(doubled), "--out", str(tmp_path / "x.tsv")],
        capture_output=True,
        text=True,
        env=ENV,
    )
    assert done.returncode == 1 and "line 2: the tables list other variants" in done.stderr
    assert len(done.stderr.splitlines()) == 1 and not (tmp_path / "x.tsv").exists()


def pseudo_log_likelihood(net, alphabet, sequence) -> float:
    """The sum over a sequence's residues of each one's log-probability with it masked, by
    fair-esm's own forward pass: predict.py's `compute_pppl`, each residue counted once."""
    _, _, toks = alphabet.get_batch_converter()([("mutant", sequence)])
    positions = torch.arange(len(sequence)) + 1
    copies = toks.repeat(len(sequence), 1)
    copies[torch.arange(len(sequence)), positions] = alphabet.mask_idx
    with torch.no_grad():
        log_p = torch.log_softmax(net(copies)["logits"], -1)
    return float(log_p[torch.arange(len(sequence)), positions, toks[0, positions]].sum())


def mutated(sequence, mutant):
    letters = list(sequence)
    for change in mutant.split(":"):
        letters[int(change[1:-1]) - 1] = change[-1]
    return "".join(letters)


def test_pseudo_ppl_is_each_mutant_sequences_own_pseudo_log_likelihood(run, checkpoint):
    workdir, config, rows, _ = run
    # the module's run's `include`: its records' scores come from the store
    scoring = ["variant_scoring=[wt_marginals,masked_marginals,pseudo_ppl]", "include=[mean,pll]"]
    done = snakemake(workdir, config, "--config", "variants=variants.csv", *scoring)
    # said before any job: the mutants and their wild types, and their passes (a pass per
    # residue, and one unmasked)
    records = {id_ for id_, _ in rows}
    passes = sum(len(SEQUENCE[id_]) + 1 for id_, _ in rows)
    passes += sum(len(SEQUENCE[id_]) + 1 for id_ in records)
    said = (
        f"esmshard: pseudo_ppl: {len(rows) + len(records)} mutant sequences, {passes:,} forward "
        "passes"
    )
    lines = done.stderr.splitlines()
    at = next(k for k, line in enumerate(lines) if line.startswith(said))
    assert not any(line.startswith(("rule ", "localrule ")) for line in lines[:at])
    # with their time: at the rate this run's jobs measured (the records' run computed them)
    assert re.search(r": about (\d+h\d\dm|\d+m\d\ds) of one device's time \(at [\d.]+k? tokens/s, as this "
                     r"run's jobs measured\)$", lines[at]), lines[at]  # fmt: skip
    # the mutants' run is part of the run's status and its report
    status = subprocess.run(["esmshard", "status", str(workdir / "results")], capture_output=True,
                            text=True, env=ENV).stdout  # fmt: skip
    assert re.search(r"^mutants \(\S+mutants\): shards (\d+)/\1 \(100%\)", status, re.M), status
    report = json.loads((workdir / "results" / "report" / "scaling.json").read_text())
    mutants = report["mutants"]
    assert mutants["computed"] == len(rows) + len(records) and mutants["n_shards"] >= 1
    assert mutants["forward_tokens"] == sum(
        (len(SEQUENCE[id_]) + 1) * (len(SEQUENCE[id_]) + 2)
        for id_ in [i for i, _ in rows] + list(records)
    )
    page = (workdir / "results" / "report" / "scaling_report.html").read_text()
    assert "<h2>The mutants' run (pseudo_ppl, pllr)</h2>" in page
    # only the mutants are computed
    jobs = jobs_run(done)
    assert "embed" not in jobs and jobs["embed_mutants"] >= 1
    assert {"mutant_sequences", "shard_mutants", "merge_mutants", "variants"} <= set(jobs)
    with open(workdir / "results" / "variant_scores.tsv", newline="") as fh:
        got = list(csv.DictReader(fh, delimiter="\t"))
    assert list(got[0]) == ["id", "mutant", "DMS_score", "wt_marginals", "masked_marginals",
                            "pseudo_ppl", "pseudo_ppl_wild_type"]  # fmt: skip
    assert [(r["id"], r["mutant"]) for r in got] == rows
    net, alphabet = fair_esm_model(checkpoint)
    wild = {id_: pseudo_log_likelihood(net, alphabet, SEQUENCE[id_]) for id_ in records}
    for r in got:
        # the mutant's PLL minus the wild type's: a log-ratio, higher fitter, as the others
        want = pseudo_log_likelihood(net, alphabet, mutated(SEQUENCE[r["id"]], r["mutant"]))
        assert abs(float(r["pseudo_ppl"]) - (want - wild[r["id"]])) <= 1e-3, (r, want)
        assert abs(float(r["pseudo_ppl_wild_type"]) - wild[r["id"]]) <= 1e-3
    # a table with one more mutant computes that mutant alone
    sequence = SEQUENCE[IDS[3]]
    extra = (IDS[3], f"{sequence[1]}2{'K' if sequence[1] != 'K' else 'R'}")
    with open(workdir / "more.csv", "w", newline="") as fh:
        csv.writer(fh).writerows([("id", "mutant"), *rows, extra])
    done = snakemake(workdir, config, "--config", "variants=more.csv", *scoring)
    assert jobs_run(done)["embed_mutants"] == 1
    run_json = json.loads((workdir / "results" / "mutants" / "run.json").read_text())
    # the new mutant and its record's wild type; the others from the store
    assert run_json["computed"] == 2 and run_json["from_store"] == len(rows) + len(records)
    with open(workdir / "results" / "variant_scores.tsv", newline="") as fh:
        last = list(csv.DictReader(fh, delimiter="\t"))[-1]
    want = pseudo_log_likelihood(net, alphabet, mutated(sequence, extra[1]))
    want -= pseudo_log_likelihood(net, alphabet, sequence)
    assert (last["id"], last["mutant"]) == extra
    assert abs(float(last["pseudo_ppl"]) - want) <= 1e-3


def crop_like_esm_variants(wild, mutant, start):
    """esm-variants' `crop_indel` recipe (written here from its description, checked once
    against its code): both cut to 1,022 residues around the change's 1-based `start`, 511
    before it; the shorter of the two ends earlier by the difference of their lengths; moved
    left where the window would run past the end."""
    if max(len(wild), len(mutant)) <= 1022:
        return wild, mutant
    left, shorter_by = start - 1, len(wild) - len(mutant)
    begin = int(left - 511)
    end_wild = left + 511 - min(begin, 0) + min(shorter_by, 0)
    end_mutant = left + 511 - min(begin, 0) - max(shorter_by, 0)
    begin = max(begin, 0)
    end_wild, end_mutant = min(end_wild, len(wild)), min(end_mutant, len(mutant))
    if begin > 0 and max(end_wild, end_mutant) - begin < 1022:
        begin = max(0, max(end_wild, end_mutant) - 1022)
    return wild[begin:end_wild], mutant[begin:end_mutant]


def test_indels_and_multi_residue_changes_are_scored_by_pllr_as_esm_variants_does(
    tmp_path, checkpoint
):
    """`pllr` (esm-variants' `get_PLLR`): a deletion, an insertion with `start_pos`, a delins,
    a double substitution and a change near residue 2,000 of a 3,000-residue protein (cropped
    to one window): the unmasked one-pass PLL of the mutant minus the wild type's, within 1e-3;
    the stop-gain's and the other strategies' cells of rows they cannot score left empty."""
    from helpers import LONG_PROTEIN

    short_id, short = IDS[0], SEQUENCE[IDS[0]]
    long_id, long = "R1AB_first_3000", read_records(LONG_PROTEIN)[0][1][:3000]
    fasta(tmp_path / "proteins.fasta", [(f">{short_id}", short), (f">{long_id}", long)])
    double = f"{short[2]}3{'A' if short[2] != 'A' else 'C'}:{short[6]}7W"
    rows = [  # id, mutant, mutated_sequence, start_pos
        (short_id, "", short[:9] + short[12:], ""),  # deletion of residues 10-12
        (short_id, "", short[:4] + "GSG" + short[4:], "5"),  # insertion before residue 5
        (short_id, "", short[:19] + "PW" + short[22:], ""),  # delins
        (short_id, double, "", ""),  # a double substitution
        (short_id, f"{short[16]}17*", "", ""),  # a stop-gain: pllr has no score for it
        (long_id, "", long[:1999] + long[2009:], ""),  # deletion in a long protein
    ]
    table = tmp_path / "changes.csv"
    with open(table, "w", newline="") as fh:
        csv.writer(fh).writerows([("id", "mutant", "mutated_sequence", "start_pos"), *rows])
    config = {"input": "proteins.fasta", "model": str(checkpoint), "outdir": "out"}
    # fair-esm's own forward pass: a PLL sums a window's 1,022 log-probabilities, whose fp32
    # rounding the fast path's other order of operations adds up to 6e-4 (its own parity is
    # tested per value)
    done = snakemake(tmp_path, config, "--config", f"variants={table}",
                     "variant_scoring=[wt_marginals,pllr]", "fast_path=false")  # fmt: skip
    said = [line for line in done.stderr.splitlines() if line.startswith("esmshard: pllr:")]
    assert said and "forward passes (one each, unmasked)" in said[0], done.stderr
    with open(tmp_path / "out" / "variant_scores.tsv", newline="") as fh:
        got = list(csv.DictReader(fh, delimiter="\t"))
    assert list(got[0]) == ["id", "mutant", "mutated_sequence", "start_pos", "wt_marginals",
                            "pllr"]  # fmt: skip
    net, alphabet = fair_esm_model(checkpoint)

    def one_pass_pll(sequence):
        _, _, toks = alphabet.get_batch_converter()([("s", sequence)])
        with torch.no_grad():
            logp = torch.log_softmax(net(toks)["logits"], -1)[0].double()
        return float(sum(logp[1 + i, alphabet.get_idx(a)] for i, a in enumerate(sequence)))

    for (id_, mutant, mutated_sequence, start), r in zip(rows, got, strict=True):
        wild = short if id_ == short_id else long
        if mutant.endswith("*"):
            assert r["pllr"] == "" and r["wt_marginals"] != ""
            continue
        if mutant:  # the substitutions made
            mutated_sequence = list(wild)
            for part in mutant.split(":"):
                mutated_sequence[int(part[1:-1]) - 1] = part[-1]
            mutated_sequence = "".join(mutated_sequence)
        first = (
            int(start)
            if start
            else next(k + 1 for k, (a, b) in enumerate(zip(wild, mutated_sequence)) if a != b)
        )
        cropped_wild, cropped_mutant = crop_like_esm_variants(wild, mutated_sequence, first)
        want = one_pass_pll(cropped_mutant) - one_pass_pll(cropped_wild)
        # a difference of two sums of up to 1,022 log-probabilities each: within 1e-3, as the
        # pseudo-log-likelihoods above (each term's rounding is up to 1e-4, by the test above)
        assert abs(float(r["pllr"]) - want) <= 1e-3, (r, want)
        assert (r["wt_marginals"] == "") == (not mutant)  # a mutated_sequence alone has none
    ours = [line for line in done.stderr.splitlines() if line.startswith("esmshard: variants")]
    assert ours[-1].endswith("left empty where a strategy cannot score the row: wt_marginals 4, "
                             "pllr 1"), ours  # fmt: skip


def test_a_change_that_cannot_be_scored_is_one_line_before_any_job(tmp_path, checkpoint):
    short_id, short = IDS[0], SEQUENCE[IDS[0]]
    fasta(tmp_path / "proteins.fasta", [(f">{short_id}", short)])
    wrong = f"{'A' if short[2] != 'A' else 'C'}3W"
    cases = [
        (
            (short_id, "", short[:5] + "J" + short[6:], ""),
            "mutated_sequence holds J, which is not one of the 20 amino acids",
        ),
        (
            (short_id, "", short[:5] + short[6:], str(len(short) + 5)),
            f"start_pos {len(short) + 5} is past the end of its record ({len(short)} residues)",
        ),
        (
            (short_id, f"{short[2]}3W", short[:4] + "W" + short[5:], ""),
            f"mutant {short[2]}3W and mutated_sequence disagree",
        ),
        ((short_id, f"{short[len(short) - 1]}{len(short) + 3}*", "", ""), "is beyond the"),
        ((short_id, wrong, "", ""), "the record has"),
    ]
    config = {"input": "proteins.fasta", "model": str(checkpoint), "outdir": "out"}
    for k, (row, said) in enumerate(cases):
        table = tmp_path / f"bad{k}.csv"
        with open(table, "w", newline="") as fh:
            csv.writer(fh).writerows([("id", "mutant", "mutated_sequence", "start_pos"), row])
        refused = config_check(tmp_path, config, "--config", f"variants={table}",
                               "variant_scoring=[pllr]")  # fmt: skip
        line = the_one_refusal(refused)
        assert f"{table}:2:" in line and said in line, line
