import pytest
import torch
from helpers import CONFIG_SCHEMA

from esmshard.compute import precision


def test_auto_is_fp32_on_cpu_and_a_named_precision_is_kept():
    assert precision.resolve("auto", torch.device("cpu")).name == "fp32"
    assert precision.resolve("bf16", torch.device("cpu")).name == "bf16"


def test_every_precision_is_a_config_choice_and_runs_on_cpu():
    assert CONFIG_SCHEMA["properties"]["precision"]["enum"] == [
        precision.AUTO,
        *precision.PRECISIONS,
    ]
    linear, x = torch.nn.Linear(8, 4), torch.randn(2, 8)
    for p in precision.PRECISIONS.values():
        with precision.autocast(p, torch.device("cpu")):
            out = linear(x)
        expected = getattr(torch, p.autocast_dtype) if p.autocast_dtype else torch.float32
        assert out.dtype == expected, p.name


def test_fp8_on_a_gpu_before_hopper_says_which_gpu_and_what_to_use(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device: "NVIDIA A100-SXM4-80GB")
    with pytest.raises(precision.PrecisionError) as refused:
        precision.resolve("fp8", torch.device("cuda", 0))
    assert str(refused.value) == (
        "precision: fp8 needs a GPU of compute capability 9.0 or newer (Hopper: H100, H200); "
        "NVIDIA A100-SXM4-80GB is 8.0: use precision: bf16 (or auto)"
    )
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device: (9, 0))
    assert precision.resolve("fp8", torch.device("cuda", 0)).fp8_products
    assert precision.resolve("fp8", torch.device("cpu")).fp8_products
