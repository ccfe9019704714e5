"""T5 encoders (ProtT5, Ankh) in esmshard's own module: transformers' T5EncoderModel numbers
through the `snakemake` command line and `esmshard run` as users type them, on real proteins (one
over 1,000 residues, one with a selenocysteine); the tokenizer read from the folder's own files;
a full T5's decoder never loaded; the refusals, before any job."""

import io
import json
import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from helpers import (
    PROTEOME,
    config_check,
    fasta,
    hidden_states_alone,
    hub_cache,
    read_records,
    refused_before_any_job,
    snakemake,
    the_one_refusal,
    write_subset,
)

import esmshard
from esmshard.compute.embedder import Embedder
from esmshard.compute.precision import PRECISIONS
from esmshard.config import ConfigError, for_family
from esmshard.input.fasta import ALPHABET
from esmshard.models import T5, ModelError, parse_spec
from esmshard.models.t5 import T5Encoder
from esmshard.models.t5_files import SHAPES
from esmshard.models.t5_tokenizer import write_tokenizer

transformers = pytest.importorskip("transformers")  # a test extra: `pip install -e .[test]`
spm = pytest.importorskip("sentencepiece")

_LONG = next(i for i, (_, s) in enumerate(read_records(PROTEOME)) if 1000 <= len(s) <= 1100)
# Six short proteins, one of 1,000+ residues and FDHF, whose selenocysteine is a U.
PROTEINS = write_subset(
    "ecoli_t5.fasta",
    lambda i, h, s: i % 300 == 0 and len(s) <= 200 or i == _LONG or "|FDHF_ECOLI " in h,
)


def records():
    return [(header[1:].split()[0], sequence) for header, sequence in read_records(PROTEINS)]


def prott5_tokenizer(folder):
    """A sentencepiece model as ProtT5 publishes one (spiece.model: one piece per residue,
    `▁A` and so on, T5's specials first), trained for the test on the proteins' residues
    space-separated, as ProtT5 tokenizes them; its numbering is its own."""
    lines = [" ".join(s) for _, s in records()] + [" ".join(sorted(ALPHABET))]
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_writer=model, model_type="word",
        vocab_size=len(ALPHABET) + 3, pad_id=0, eos_id=1, unk_id=2, bos_id=-1,
        pad_piece="<pad>", eos_piece="</s>", unk_piece="<unk>", hard_vocab_limit=False,
        minloglevel=2,
    )  # fmt: skip
    (folder / "spiece.model").write_bytes(model.getvalue())


def ankh_tokenizer(folder):
    """A tokenizer.json as Ankh publishes one (one token per residue, `</s>` appended, T5's
    pre-training sentinels after them), with a numbering of its own (the residues in reverse
    alphabetical order)."""
    sentinels = [f"<extra_id_{i}>" for i in range(116)]
    write_tokenizer(folder, "".join(sorted(ALPHABET, reverse=True)), sentinels)


def prostt5_tokenizer(folder):
    """A tokenizer.json with ProstT5's vocabulary: T5's specials, the residues, its two prefixes
    and the 3Di structure letters (lower case)."""
    extra = ("<AA2fold>", "<fold2AA>", *"acdefghiklmnpqrstvwy")
    write_tokenizer(folder, "".join(sorted(ALPHABET)), extra)


VARIANTS = {
    # ProtT5: residues space-separated, U/Z/O/B as X (bio_embeddings, ProtTrans' examples)
    "prott5": (
        prott5_tokenizer,
        lambda tok, seqs: tok(
            [" ".join(re.sub("[UZOB]", "X", s)) for s in seqs], padding=True, return_tensors="pt"
        ),
    ),
    # ProstT5: as ProtT5, after the `<AA2fold>` prefix (its authors' embedding example)
    "prostt5": (
        prostt5_tokenizer,
        lambda tok, seqs: tok(
            ["<AA2fold> " + " ".join(re.sub("[UZOB]", "X", s)) for s in seqs],
            padding=True,
            return_tensors="pt",
        ),
    ),
    # Ankh: the residues as words (Ankh's examples)
    "ankh": (
        ankh_tokenizer,
        lambda tok, seqs: tok(
            [list(s) for s in seqs], is_split_into_words=True, padding=True, return_tensors="pt"
        ),
    ),
}


def t5_config(shape, layers, **changes):
    (_, dim, heads), head_dim, ffn, feed_forward, buckets, distance, eps, vocab = shape
    settings = dict(
        vocab_size=vocab, d_model=dim, d_kv=head_dim, d_ff=ffn, num_layers=layers,
        num_heads=heads, feed_forward_proj=feed_forward, relative_attention_num_buckets=buckets,
        relative_attention_max_distance=distance, layer_norm_epsilon=eps,
    )  # fmt: skip
    return transformers.T5Config(**{**settings, **changes})


def saved_model(folder, variant, shape, layers, cls=None, dtype=torch.float32, **changes):
    """A random T5 encoder (transformers' own initialisation, its norms moved away from 1 so
    that one left out shows) saved with its tokenizer."""
    torch.manual_seed(0)
    model = (cls or transformers.T5EncoderModel)(t5_config(shape, layers, **changes)).eval()
    with torch.no_grad():
        for name, tensor in model.named_parameters():
            if "layer_norm" in name:
                tensor.add_(torch.randn_like(tensor) * 0.3)
    model.to(dtype).save_pretrained(folder)
    VARIANTS[variant][0](folder)
    return folder


def reference(folder, variant, sequences):
    """transformers' hidden states of `sequences` (fp32), tokenized by its own tokenizer class
    from the folder's files; each protein run alone, its rows zero past its tokens."""
    if variant == "prott5":
        tokenizer = transformers.T5Tokenizer.from_pretrained(folder)
    else:
        tokenizer = transformers.PreTrainedTokenizerFast.from_pretrained(folder, pad_token="<pad>")
    tokens = VARIANTS[variant][1](tokenizer, sequences)
    model = transformers.T5EncoderModel.from_pretrained(folder, dtype=torch.float32).eval()
    ids = tokens["input_ids"]
    return ids, hidden_states_alone(model, ids, tokens["attention_mask"].bool())


SMALL = {  # the published shapes, narrower (fast), 3 layers
    "prott5": SHAPES["prot_t5_xl_uniref50"]
    ._replace(head_dim=16, ffn=128)
    ._replace(arch=SHAPES["prot_t5_xl_uniref50"].arch._replace(dim=64, heads=4)),
    "prostt5": SHAPES["prot_t5_xl_uniref50"]  # ProstT5 is ProtT5-XL's shape
    ._replace(head_dim=16, ffn=128)
    ._replace(arch=SHAPES["prot_t5_xl_uniref50"].arch._replace(dim=64, heads=4)),
    "ankh": SHAPES["ankh_base"]
    ._replace(head_dim=16, ffn=96)
    ._replace(arch=SHAPES["ankh_base"].arch._replace(dim=64, heads=4)),
}


@pytest.mark.parametrize("variant", ["prott5", "prostt5", "ankh"])
def test_every_layer_and_the_tokens_equal_transformers(tmp_path, variant):
    folder = saved_model(tmp_path, variant, SMALL[variant], 3)
    spec = parse_spec(str(folder))
    assert (spec.family, spec.arch) == (T5, (3, 64, 4))
    net, alphabet = esmshard.models.load(spec)
    assert isinstance(net, T5Encoder)
    sequences = [s for _, s in records()][:7]
    tokens, hidden = reference(folder, variant, sequences)
    embedder = Embedder(net, alphabet, [0, 1, 3], torch.device("cpu"), PRECISIONS["fp32"],
                        kinds=("mean", "per_tok"))  # fmt: skip
    # [ProstT5's <AA2fold>,] residues, </s>, padding: no BOS
    assert torch.equal(embedder.tokens(sequences), tokens)
    first = int(variant == "prostt5")  # the prefix is left out of the residues' rows
    assert alphabet.prepend_bos == bool(first)
    reps = embedder.forward(sequences)
    for row, sequence in enumerate(sequences):
        for layer in (0, 1, 3):
            residues = hidden[layer][row, first : first + len(sequence)].numpy()  # </s> left out
            np.testing.assert_allclose(reps[row][layer].per_tok, residues, atol=1e-5, rtol=0)
            np.testing.assert_allclose(reps[row][layer].mean, residues.mean(0), atol=1e-5, rtol=0)


def means(outdir):
    with esmshard.open_embeddings(outdir) as emb:
        assert emb.h5.attrs["model_family"] == "t5"
        return {id_: emb[id_].mean for id_ in emb.ids()}


# ProtT5-XL-U50's width and Ankh-base's, two layers each: ProtT5 saved in fp16, as
# Rostlab/prot_t5_xl_half_uniref50-enc is, run by `esmshard run`; Ankh reached through an hf:
# name from the cache, run by `snakemake`. Each way in runs once (a run at ProtT5-XL's width
# costs a minute of CI), the other pair being the same code with other numbers.
@pytest.mark.parametrize(
    "variant, name, dtype, way",
    [
        ("prott5", "prot_t5_xl_uniref50", torch.float16, "esmshard run"),
        ("ankh", "ankh_base", torch.float32, "snakemake"),
    ],
)
def test_published_widths_give_transformers_means_through_snakemake_and_esmshard_run(
    tmp_path, variant, name, dtype, way
):
    folder = saved_model(tmp_path / name, variant, SHAPES[name], 2, dtype=dtype)
    assert parse_spec(str(folder)).arch == SHAPES[name].arch._replace(layers=2)
    listed = records()
    assert max(len(s) for _, s in listed) >= 1000 and any("U" in s for _, s in listed)
    _, hidden = reference(folder, variant, [s for _, s in listed])
    want = {id_: hidden[-1][row, : len(s)].mean(0).numpy() for row, (id_, s) in enumerate(listed)}

    model, env = str(folder), {}
    if variant == "ankh":
        model = "hf:ElnaggarLab/ankh-base"
        cache = hub_cache(tmp_path / "hub", "ElnaggarLab/ankh-base", folder)
        env = {"HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}
    if way == "snakemake":
        snakemake(tmp_path / "snakemake", {}, "--config", f"input={PROTEINS}", f"model={model}",
                  "precision=fp32", env=env)  # fmt: skip
        outdir = tmp_path / "snakemake" / "results"
    else:
        command = [os.path.join(os.path.dirname(sys.executable), "esmshard"), "run",
                   str(PROTEINS), "-o", "out", "--model", model, "--config", "precision=fp32"]  # fmt: skip
        run = subprocess.run(command, cwd=tmp_path, env={**os.environ, **env},
                             capture_output=True, text=True)  # fmt: skip
        assert run.returncode == 0, run.stderr
        outdir = tmp_path / "out"
    got = means(outdir)
    assert set(got) == set(want)
    for id_, mean in want.items():
        np.testing.assert_allclose(got[id_][2], mean, atol=1e-4, rtol=0)


def test_prostt5_takes_its_prefix_as_its_authors_do(tmp_path):
    # A ProtT5-shaped folder whose tokenizer has <AA2fold>: read as ProtT5, its means were off
    # by 0.15 (no prefix); the reference here is the authors' "<AA2fold> M K ..." input. At
    # ProtT5-XL's width (ProstT5's), two of its 24 layers; the proteins but the longest (the
    # ProtT5 test's), whose length is the width's test, not the prefix's.
    folder = saved_model(tmp_path / "prostt5", "prostt5", SHAPES["prot_t5_xl_uniref50"], 2)
    listed = [(id_, s) for id_, s in records() if len(s) < 1000]
    assert any("U" in s for _, s in listed)
    proteins = fasta(tmp_path / "proteins.fasta", [(f">{id_}", s) for id_, s in listed])
    _, hidden = reference(folder, "prostt5", [s for _, s in listed])
    # in this process (ProtT5's and Ankh's cases above go through the command line)
    with esmshard.embed(
        proteins, str(folder), include=["mean", "per_tok"], precision="fp32"
    ) as emb:
        for row, (id_, sequence) in enumerate(listed):
            residues = hidden[-1][row, 1 : 1 + len(sequence)].numpy()
            np.testing.assert_allclose(emb[id_].per_tok[2], residues, atol=1e-4, rtol=0)
            np.testing.assert_allclose(emb[id_].mean[2], residues.mean(0), atol=1e-4, rtol=0)


# In a process of its own: the peak resident memory while loading (VmHWM: ru_maxrss would count
# the forking test process's own), over the resident memory before it.
LOAD_PEAK = textwrap.dedent("""
    import json, re, sys
    import torch, sentencepiece, tokenizers, safetensors
    import esmshard.models as models

    def status(key):
        with open("/proc/self/status") as fh:
            return int(re.search(key + r":\\s+(\\d+) kB", fh.read()).group(1)) / 1024

    spec = models.parse_spec(sys.argv[1])
    before = status("VmRSS")
    net, _ = models.load(spec)
    print(json.dumps({"grew_mb": status("VmHWM") - before,
                      "params": sum(p.numel() for p in net.parameters())}))
""")


def test_a_full_t5_is_accepted_and_its_decoder_never_loaded(tmp_path):
    shape = SHAPES["ankh_base"]
    full = saved_model(tmp_path / "full", "ankh", shape, 2, transformers.T5ForConditionalGeneration,
                       num_decoder_layers=16)  # fmt: skip
    file_bytes = sum(p.stat().st_size for p in full.glob("*.safetensors"))
    # transformers' encoder alone from the same folder is the reference
    sequences = [s for _, s in records()][:4]
    _, hidden = reference(full, "ankh", sequences)
    net, alphabet = esmshard.models.load(parse_spec(str(full)))
    got = Embedder(net, alphabet, [2], torch.device("cpu"), PRECISIONS["fp32"]).forward(sequences)
    for row, sequence in enumerate(sequences):
        want = hidden[2][row, : len(sequence)].numpy()
        np.testing.assert_allclose(got[row][2].per_tok, want, atol=1e-5, rtol=0)
    del net

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    run = subprocess.run([sys.executable, "-c", LOAD_PEAK, str(full)], capture_output=True,
                         text=True, env=env, check=True)  # fmt: skip
    peak = json.loads(run.stdout)
    encoder_mb = peak["params"] * 4 / 2**20
    # The file holds the encoder, 16 decoder layers (more than an encoder layer's weights each)
    # and the embeddings, 11x the encoder: loading grows by the encoder's fp32 weights, a layer's
    # parts while they are joined, and torch's code for models built without storage (measured:
    # 180 MB for a 72 MB encoder; reading the decoder too would add 720 MB).
    assert file_bytes / 2**20 > 10 * encoder_mb
    assert peak["grew_mb"] <= 2 * encoder_mb + 100, (peak, encoder_mb)


def test_refusals_name_the_file_or_key_before_any_job(tmp_path):
    folder = saved_model(tmp_path / "prott5", "prott5", SMALL["prott5"], 1)
    typed = ["--config", f"input={PROTEINS}", f"model={folder}"]
    for include, named in (
        ("include=[mean,bos]", "include: bos: T5 encoder"),
        ("include=[mean,contacts]", "include: contacts: T5 encoder"),
        ("variants=all", "variant_scoring: masked_marginals (the scores it reads): T5 encoder "
         f"({folder.name}) has no language-model head that esmshard runs"),
    ):  # fmt: skip
        refused = config_check(tmp_path / "run", {}, *typed, include)
        assert any(named in line for line in refused), refused
        assert not (tmp_path / "run" / "results").exists()

    (folder / "spiece.model").unlink()
    refused = config_check(tmp_path / "run", {}, *typed)
    assert f"model folder '{folder}' holds no tokenizer (tokenizer.json or spiece.model)" in (
        the_one_refusal(refused)
    )
    assert not (tmp_path / "run" / "results").exists()

    silu = saved_model(tmp_path / "silu", "ankh", SMALL["ankh"], 1, feed_forward_proj="gated-silu")
    with pytest.raises(ModelError, match=r"config.json: feed_forward_proj 'gated-silu' is a T5 "
                                         "variant esmshard does not run"):  # fmt: skip
        parse_spec(str(silu))


def test_a_tokenizer_with_tokens_of_another_convention_is_refused_naming_them(tmp_path):
    """A T5 whose tokenizer holds tokens no protein T5 esmshard knows has (a mask, a CLS, a
    two-letter word) may expect input written another way: refused before any job, never
    embedded as ProtT5 or Ankh."""
    folder = saved_model(tmp_path / "other", "ankh", SMALL["ankh"], 1)
    write_tokenizer(folder, "".join(sorted(ALPHABET)), ("<cls>", "<mask>", "AB", "<extra_id_0>"))
    line = the_one_refusal(
        config_check(tmp_path / "run", {}, "--config", f"input={PROTEINS}", f"model={folder}")
    )
    assert "tokenizer.json: the tokenizer has tokens esmshard cannot account for (<cls>, " in line
    assert "<mask>, AB)" in line, line
    assert not (tmp_path / "run" / "results").exists()


def test_t5_limit_is_a_default_and_bos_is_refused():
    config = {"truncation_seq_length": "auto", "include": ["mean"], "long_sequences": "truncate",
              "model": "t5"}  # fmt: skip
    assert for_family(config, T5)["truncation_seq_length"] == T5.max_residues
    # relative positions have no end: a longer limit is the user's to choose
    assert (
        for_family({**config, "truncation_seq_length": 10000}, T5)["truncation_seq_length"]
        == 10000
    )
    with pytest.raises(ConfigError, match="include: bos"):
        for_family({**config, "include": ["bos"]}, T5)


def test_bf16_autocast_runs_the_same_path_within_bf16s_precision(tmp_path):
    """The GPUs' precision, through CPU autocast: fp32 norms, bf16 products and attention mask."""
    folder = saved_model(tmp_path, "ankh", SMALL["ankh"], 3)
    net, alphabet = esmshard.models.load(parse_spec(str(folder)))
    sequences = [s for _, s in records()][:5]
    means = {}
    for precision in ("fp32", "bf16"):
        embedder = Embedder(net, alphabet, [3], torch.device("cpu"), PRECISIONS[precision])
        means[precision] = np.stack([rep[3].mean for rep in embedder.forward(sequences)])
    assert np.isfinite(means["bf16"]).all()
    scale = np.abs(means["fp32"]).max()
    np.testing.assert_allclose(means["bf16"], means["fp32"], atol=0.03 * scale, rtol=0)


def test_weights_or_a_tokenizer_that_do_not_fit_the_config_are_one_line_before_any_job(tmp_path):
    """A config whose d_ff is not its weights' (a file of another model's beside it), and a
    tokenizer that numbers residues past the config's vocab_size (another model's tokenizer):
    refused before any job, naming the file, where the embed job crashed."""
    folder = saved_model(tmp_path / "ffn", "ankh", SMALL["ankh"], 1)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "d_ff": config["d_ff"] * 2}))
    result = snakemake(tmp_path / "ffn-run", {"input": str(PROTEINS), "model": str(folder)},
                       check=False)  # fmt: skip
    line = refused_before_any_job(result)
    assert (
        line.startswith(f"esmshard: {folder}: tensor layers.0.")
        and "in the weights, where the T5 encoder of 1 layers" in line
    )

    folder = saved_model(tmp_path / "vocab", "ankh", SMALL["ankh"], 1, vocab_size=10)
    line = the_one_refusal(
        config_check(tmp_path / "vocab-run", {"input": str(PROTEINS), "model": str(folder)})
    )
    assert line.startswith(f"esmshard: {folder / 'tokenizer.json'}: the tokenizer numbers the ")
    assert "beyond the model's 10 token embeddings (config.json's vocab_size)" in line
