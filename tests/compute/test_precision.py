import torch
import yaml
from conftest import REPO

from esmshard.compute import precision

SCHEMA = yaml.safe_load((REPO / "workflow" / "schemas" / "config.schema.yaml").read_text())


def test_auto_is_fp32_on_cpu_and_a_named_precision_is_kept():
    assert precision.resolve("auto", torch.device("cpu")).name == "fp32"
    assert precision.resolve("bf16", torch.device("cpu")).name == "bf16"


def test_every_precision_is_a_config_choice_and_runs_on_cpu():
    assert SCHEMA["properties"]["precision"]["enum"] == [precision.AUTO, *precision.PRECISIONS]
    linear, x = torch.nn.Linear(8, 4), torch.randn(2, 8)
    for p in precision.PRECISIONS.values():
        with precision.autocast(p, torch.device("cpu")):
            out = linear(x)
        expected = getattr(torch, p.autocast_dtype) if p.autocast_dtype else torch.float32
        assert out.dtype == expected, p.name
