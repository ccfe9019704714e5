import pytest
from helpers import CONFIG_SCHEMA, REPO
from snakemake.utils import validate

from esmshard.config import coerce_config


def checked(config):
    config = coerce_config(config, CONFIG_SCHEMA)
    validate(config, str(REPO / "workflow" / "schemas" / "config.schema.yaml"))
    return config


@pytest.mark.parametrize(
    "typed, meant",
    [
        # as Snakemake's --config hands them over (YAML's base loader) and as YAML files give them
        ({"gpus": ["0", "1"]}, {"gpus": [0, 1]}),
        ({"gpus": 0}, {"gpus": [0]}),
        ({"gpus": "auto"}, {"gpus": "auto"}),
        ({"repr_layers": ["-1", "6"]}, {"repr_layers": [-1, 6]}),
        ({"repr_layers": -1}, {"repr_layers": [-1]}),
        ({"include": "mean"}, {"include": ["mean"]}),
        ({"input": "a.fasta"}, {"input": ["a.fasta"]}),
        ({"input": ["a.fasta", "b.fasta"]}, {"input": ["a.fasta", "b.fasta"]}),
        ({"shards": "4"}, {"shards": 4}),
        ({"toks_per_batch": "auto"}, {"toks_per_batch": "auto"}),
        ({"fast_path": "False"}, {"fast_path": False}),
        ({"outdir": 2024}, {"outdir": "2024"}),
        ({"compile": "on"}, {"compile": "on"}),
        ({"compile": True}, {"compile": True}),  # a YAML file's bare `on`
        ({"compile": "false"}, {"compile": False}),
        ({"model": {"random": None}}, {"model": "random:"}),  # model=random: (the model's
        # check then names it: "model 'random:': unknown architecture; use one of ...")
    ],
)
def test_typed_forms_mean_what_a_yaml_file_means(typed, meant):
    config = checked({"input": ["x.fasta"], **typed})
    assert {k: config[k] for k in meant} == meant


@pytest.mark.parametrize(
    "bad, key",
    [
        ({"gpus": ["0", "one"]}, "gpus"),
        ({"repr_layers": ["1.5"]}, "repr_layers"),
        ({"include": ["mean", "attention"]}, "include"),
        ({"shards": "many"}, "shards"),
        ({"precision": "fp4"}, "precision"),
        ({"fast_path": "maybe"}, "fast_path"),
        ({"compile": "sometimes"}, "compile"),
    ],
)
def test_values_that_mean_nothing_valid_are_refused_naming_the_key(bad, key):
    with pytest.raises(Exception) as err:
        checked({"input": ["x.fasta"], **bad})
    assert f"'{key}'" in str(err.value)


def test_a_leading_tilde_is_the_home_folder_in_every_path_key(monkeypatch, tmp_path):
    from esmshard.config import expand_home

    monkeypatch.setenv("HOME", str(tmp_path))
    config = {"input": ["~/a.fasta", "b.fasta"], "outdir": "~/out", "store": None,
              "model": "random:esm2_t6_8M_UR50D", "shards": "auto"}  # fmt: skip
    assert expand_home(config) == {
        "input": [f"{tmp_path}/a.fasta", "b.fasta"],
        "outdir": f"{tmp_path}/out",
        "model": "random:esm2_t6_8M_UR50D",
    }


def test_a_list_with_a_bad_item_names_that_item():
    from esmshard.config import schema_problems

    problems = schema_problems({"include": ["mean", "attention"]}, CONFIG_SCHEMA)
    assert problems["include"].startswith(
        "include: [mean,attention]: attention is not valid; give a list of items each one of mean"
    )
