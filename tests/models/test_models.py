import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import PROTEINS, TINY_MODEL, config_check, the_one_refusal

import esmshard
from esmshard import models
from esmshard.config import ConfigError
from esmshard.models import esm2, esm2_files, weights


def test_local_checkpoint_in_fair_esm_format_loads_safely(checkpoint):
    assert checkpoint.name == f"{TINY_MODEL}.pt"
    assert (checkpoint.parent / f"{TINY_MODEL}-contact-regression.pt").is_file()
    raw = weights.safe_load(checkpoint)
    assert type(raw["cfg"]["model"]).__name__ == "Namespace"
    loaded, _ = models.load(models.parse_spec(str(checkpoint)))
    reference = esm2.random_model(TINY_MODEL)
    for (name, a), (_, b) in zip(loaded.state_dict().items(), reference.state_dict().items()):
        assert torch.equal(a, b), name


def test_a_checkpoint_in_torchs_format_before_1_6_is_read_whole(tmp_path, checkpoint):
    """Such a file cannot be memory-mapped: it is read as it is, not called damaged."""
    old = tmp_path / checkpoint.name
    torch.save(
        torch.load(checkpoint, weights_only=False), old, _use_new_zipfile_serialization=False
    )
    shutil.copy(checkpoint.with_name(f"{TINY_MODEL}-contact-regression.pt"), tmp_path)
    loaded, _ = models.load(models.parse_spec(str(old)))
    reference, _ = models.load(models.parse_spec(str(checkpoint)))
    for (name, a), (_, b) in zip(loaded.state_dict().items(), reference.state_dict().items()):
        assert torch.equal(a, b), name


class Payload:
    def __reduce__(self):
        return (os.system, ("echo unpickled",))


def test_checkpoint_with_arbitrary_object_is_refused(tmp_path, checkpoint):
    data = torch.load(checkpoint, weights_only=False)
    data["extra"] = Payload()
    bad = tmp_path / "esm2_t6_8M_UR50D.pt"
    torch.save(data, bad)
    (tmp_path / "esm2_t6_8M_UR50D-contact-regression.pt").write_bytes(
        (checkpoint.parent / "esm2_t6_8M_UR50D-contact-regression.pt").read_bytes()
    )
    with pytest.raises(models.ModelError, match="refusing to load .*posix.system"):
        models.load(models.parse_spec(str(bad)))


def test_hub_name_without_network_says_where_to_put_weights(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    monkeypatch.setenv("https_proxy", "http://127.0.0.1:9")  # nothing listens: no network
    with pytest.raises(models.ModelError) as err:
        models.ensure_available(models.parse_spec("esm2_t33_650M_UR50D"))
    message = str(err.value)
    assert "esm2_t33_650M_UR50D.pt" in message and str(tmp_path / "torch") in message
    assert "local .pt checkpoint" in message


def test_hub_model_found_in_cache_is_loaded_without_network(tmp_path, monkeypatch, checkpoint):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    monkeypatch.setenv("https_proxy", "http://127.0.0.1:9")
    cached, regression = esm2_files.hub_paths(TINY_MODEL)
    cached.parent.mkdir(parents=True)
    cached.write_bytes(checkpoint.read_bytes())
    regression.write_bytes(esm2_files.regression_path(checkpoint).read_bytes())
    loaded, _ = models.load(models.parse_spec(TINY_MODEL))
    assert loaded.num_layers == 6 and loaded.embed_dim == 320


@pytest.mark.parametrize("name", ["esm1_t34_670M_UR50S", "random:esm2_t99", "weights/my_model.pt"])
def test_models_of_no_known_family_are_rejected(name):
    with pytest.raises(models.ModelError):
        models.parse_spec(name)


def test_jobs_that_run_no_model_do_not_import_torch(tmp_path, checkpoint):
    # The Snakefile and the shard, merge and report steps would each spend about a second on it;
    # the family and shape of a model's files are read without it.
    transformers = pytest.importorskip("transformers")
    folder = tmp_path / "esmc"
    config = transformers.EsmcConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128
    )
    transformers.EsmcModel(config).save_pretrained(folder)
    code = (
        "import sys, esmshard, esmshard.models, esmshard.steps.shard, esmshard.steps.merge, esmshard.steps.report; "
        f"a = esmshard.models.parse_spec({str(checkpoint)!r}); "
        f"b = esmshard.models.parse_spec({str(folder)!r}); "
        "assert (a.family.name, b.family.name) == ('esm2', 'esmc'), (a, b); "
        "sys.exit('torch' in sys.modules)"
    )
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_local_weights_are_named_by_content_so_a_copy_is_the_same_weights(tmp_path, checkpoint):
    cache = tmp_path / "checksums.json"
    here = models.parse_spec(str(checkpoint)).identity(cache)
    copy = tmp_path / "elsewhere" / checkpoint.name
    copy.parent.mkdir()
    shutil.copy(checkpoint, copy)
    assert models.parse_spec(str(copy)).identity(cache) == here
    with open(copy, "ab") as fh:
        fh.write(b"\0")  # other content under the same name
    assert models.parse_spec(str(copy)).identity(cache) != here
    assert models.parse_spec(f"random:{TINY_MODEL}").identity(cache) == "random weights, seed 0"


def test_files_found_to_fit_are_remembered_in_the_users_cache_where_xdg_puts_it(
    tmp_path, monkeypatch, checkpoint
):
    # As pip and torch's hub: $XDG_CACHE_HOME where it is set (a cluster's scratch), else ~/.cache.
    spec = models.parse_spec(str(checkpoint))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    for xdg, cache in (
        (tmp_path / "scratch", tmp_path / "scratch"),
        ("", tmp_path / "home" / ".cache"),
    ):
        monkeypatch.setenv("XDG_CACHE_HOME", str(xdg))
        assert models.fit_problems(spec) == []
        (marker,) = (cache / "esmshard" / "weights-fit").iterdir()
        assert marker == models.checked_marker(spec) and marker.stat().st_size == 0
        marker.unlink()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["home", "scratch"]


def test_every_list_of_models_names_every_family_of_the_one_table():
    """`esmshard --help`, `esmshard run --help` and the error for an unknown model name every
    family (FAMILIES)."""
    named = [family.named for family in models.FAMILIES.values()]
    assert len(named) == 5 and "BERT encoder (ProtBert, ProtBert-BFD)" in named
    with pytest.raises(models.ModelError) as refused:
        models.parse_spec("esm3_open")
    esmshard = os.path.join(os.path.dirname(sys.executable), "esmshard")
    helped = [
        subprocess.run([esmshard, *command, "--help"], capture_output=True, text=True).stdout
        for command in ([], ["run"])  # the program's description, and run's --model
    ]
    for text in (str(refused.value), *(" ".join(h.split()) for h in helped)):
        assert all(name in text for name in named), text


def broken_esm2(folder: Path, change: str) -> Path:
    """fair-esm's ESM-2 files (the tiny shape) with `change` made: a tensor of another shape,
    or one left out; its contact-regression file beside it."""
    path = esm2.write_checkpoint(esm2.random_model(TINY_MODEL), folder, "lab_model")
    data = torch.load(path, weights_only=False)
    name = next(k for k in data["model"] if k.endswith("layers.1.fc1.weight"))
    if change == "shape":
        data["model"][name] = data["model"][name][:, :100].clone()
    else:
        del data["model"][name]
    torch.save(data, path)
    return path


@pytest.mark.parametrize(
    "change, said",
    [("shape", "tensor layers.1.fc1.weight is [1280, 100] in the weights, where the ESM-2 of 6 "
               "layers and dimension 320 that its config says has [1280, 320]: the config and "
               "the weights disagree"),
     ("missing", "the weights do not fit the ESM-2 of 6 layers and dimension 320 that its "
                 "config says: they lack 1 tensor (layers.1.fc1.weight) (a file cut short, or the "
                 "config of another model?)")],
)  # fmt: skip
def test_a_checkpoint_whose_tensors_do_not_fit_its_config_is_one_line_before_any_job(
    tmp_path, change, said
):
    path = broken_esm2(tmp_path / "weights", change)
    refused = config_check(tmp_path, {"input": str(PROTEINS), "model": str(path)})
    assert the_one_refusal(refused).startswith(f"esmshard: {path}: {said}")
    with pytest.raises(ConfigError, match=re.escape(said)):  # the model is a setting
        esmshard.embed(["MKTAYIAKQR"], str(path))
