"""What the machine has free (meminfo, cgroups v1 and v2) and the one-line refusal."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from pipeline_lib.errors import ConfigError
from pipeline_lib.memory_check import (
    available_memory,
    cgroup_available,
    check_memory,
    host_available,
)
from pipeline_lib.spec.memory import GIB, MemoryEstimate

KIB = 1024


def _meminfo(path: Path, available_kib: int, swap_kib: int = 0) -> Path:
    path.write_text(f"MemTotal:       32000000 kB\nMemFree:         1000000 kB\n"
                    f"MemAvailable:   {available_kib:8d} kB\nSwapTotal:      {swap_kib} kB\n"
                    f"SwapFree:       {swap_kib} kB\n")
    return path


def test_meminfo_and_swap_without_a_cgroup_limit(tmp_path: Path) -> None:
    meminfo = _meminfo(tmp_path / "meminfo", 20 * KIB * KIB, swap_kib=2 * KIB * KIB)
    assert host_available(meminfo, tmp_path / "no-cgroup") == (22 * GIB,
                                                               "MemAvailable + SwapFree")
    v1 = tmp_path / "v1" / "memory"
    v1.mkdir(parents=True)
    (v1 / "memory.limit_in_bytes").write_text("9223372036854771712\n")  # v1's "no limit"
    assert cgroup_available(tmp_path / "v1") is None
    (tmp_path / "v2").mkdir()
    (tmp_path / "v2" / "memory.max").write_text("max\n")
    assert cgroup_available(tmp_path / "v2") is None


def test_a_cgroup_limit_below_meminfo_wins(tmp_path: Path) -> None:
    meminfo = _meminfo(tmp_path / "meminfo", 20 * KIB * KIB)
    v2 = tmp_path / "v2"
    v2.mkdir()
    (v2 / "memory.max").write_text(f"{8 * GIB}\n")
    (v2 / "memory.stat").write_text(f"anon {3 * GIB}\nfile {4 * GIB}\n")  # cache: reclaimable
    assert host_available(meminfo, v2) == (5 * GIB, "the memory cgroup's limit less its use")
    v1 = tmp_path / "v1" / "memory"
    v1.mkdir(parents=True)
    (v1 / "memory.limit_in_bytes").write_text(f"{6 * GIB}\n")
    (v1 / "memory.stat").write_text(f"cache {GIB}\nrss 10\ntotal_cache {GIB}\n"
                                    f"total_rss {GIB}\n")
    assert cgroup_available(tmp_path / "v1") == 5 * GIB
    assert host_available(meminfo, tmp_path / "v1")[0] == 5 * GIB


def test_this_machine_tells_its_memory() -> None:
    free, source, holder = available_memory(torch.device("cpu"))
    assert free > 0 and holder == "this machine"
    assert source in ("MemAvailable", "MemAvailable + SwapFree",
                      "the memory cgroup's limit less its use")
    assert available_memory(torch.device("meta")) is None  # nothing to tell: no check


def test_refused_only_past_what_is_available() -> None:
    estimate = MemoryEstimate((("weights", 3 * GIB), ("gradients", 3 * GIB), ("EMA", 0)),
                              "model.d_model = 4096, model.vocab_size = 258 (0.75 B parameters)",
                              "lower model.d_model")
    machine = (6 * GIB, "MemAvailable", "this machine")
    check_memory(estimate, torch.device("cpu"), "training", available=machine)  # exactly fits
    with pytest.raises(ConfigError) as refused:
        check_memory(estimate, torch.device("cpu"), "training",
                     available=(5.5 * GIB, "MemAvailable", "this machine"))
    assert str(refused.value) == (
        "model.d_model = 4096, model.vocab_size = 258 (0.75 B parameters): training needs at "
        "least 6 GiB of memory (weights 3 GiB, gradients 3 GiB), but this machine has 5.5 "
        "GiB available (MemAvailable); lower model.d_model")
