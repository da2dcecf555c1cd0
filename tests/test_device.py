"""experiment.device resolution (no accelerator on the test machines)."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from pipeline_lib.device import (
    device_for_rank,
    dist_backend,
    exact_float_dtype,
    resolve_device,
    synchronize,
)
from pipeline_lib.errors import DeviceError


def test_cpu_and_auto() -> None:
    assert resolve_device("cpu") == torch.device("cpu")
    if torch.cuda.is_available():
        assert resolve_device("auto").type == "cuda"
    elif importlib.util.find_spec("torch_npu") is None:
        assert resolve_device("auto") == torch.device("cpu")
    synchronize(torch.device("cpu"))


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA present")
def test_cuda_missing_is_a_device_error() -> None:
    with pytest.raises(DeviceError, match="experiment.device"):
        resolve_device("cuda")


@pytest.mark.skipif(importlib.util.find_spec("torch_npu") is not None, reason="torch_npu present")
def test_npu_without_torch_npu_says_how_to_install() -> None:
    with pytest.raises(DeviceError, match=r"pip install -e '\.\[npu\]'"):
        resolve_device("npu")


def test_unknown_name() -> None:
    with pytest.raises(DeviceError, match="not allowed"):
        resolve_device("tpu")


def test_collective_backend_per_device_type() -> None:
    assert dist_backend(torch.device("cpu")) == "gloo"
    assert dist_backend(torch.device("cuda", 1)) == "nccl"
    assert dist_backend("npu") == "hccl"  # a type name: torch.device("npu") needs torch_npu
    with pytest.raises(DeviceError, match="no collective backend"):
        dist_backend(torch.device("meta"))
    assert device_for_rank(torch.device("cpu"), 3) == torch.device("cpu")  # ranks share it


def test_no_float64_buffers_on_an_ascend_npu() -> None:
    assert exact_float_dtype("npu") == torch.float32
    assert exact_float_dtype(torch.device("cuda", 0)) == torch.float64
    assert exact_float_dtype(torch.device("cpu")) == torch.float64
