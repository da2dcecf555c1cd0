"""Bench fixtures: offline HF settings, a byte tokenizer, a trained tiny model, its snapshot."""

from __future__ import annotations

from pathlib import Path

import pytest
from snapshot_helpers import train_pattern_model, write_tiny_snapshot


@pytest.fixture(scope="session", autouse=True)
def _offline_hf(tmp_path_factory: pytest.TempPathFactory):
    """lm-eval's datasets cache in a temporary HF_HOME; never the hub."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_DATASETS_OFFLINE", "1")
        mp.setenv("HF_HUB_OFFLINE", "1")
        mp.setenv("HF_HOME", str(tmp_path_factory.mktemp("hf_home")))
        yield


@pytest.fixture(scope="session")
def tokenizer():
    from pipeline_lib.data.tokenizer import byte_level_tokenizer

    return byte_level_tokenizer()


@pytest.fixture(scope="session")
def trained_model(tokenizer):
    return train_pattern_model(tokenizer)


@pytest.fixture(scope="session")
def snapshot_dir(tmp_path_factory, trained_model, tokenizer) -> Path:
    return write_tiny_snapshot(tmp_path_factory.mktemp("run") / "snapshots" / "step_0000007",
                               trained_model, tokenizer, step=7)


@pytest.fixture(scope="session")
def small_bench():
    """Every built-in task, 2 examples per level, levels 1..3 (training covered 1..2)."""
    from pipeline_lib.spec.config import BenchConfig

    return BenchConfig(examples_per_level=2, min_difficulty=1, max_difficulty=3, batch_size=4,
                       max_gen_toks=6, h_eff=[1, 3])


@pytest.fixture(scope="session")
def bench_report(tmp_path_factory, snapshot_dir, small_bench):
    """(report, its JSON path, tasks dir) of run_benchmarks on the tiny snapshot."""
    from pipeline_lib.bench import run_benchmarks

    out = tmp_path_factory.mktemp("bench")
    report = run_benchmarks(snapshot_dir, small_bench, out / "tasks", out / "step_0000007.json")
    return report, out / "step_0000007.json", out / "tasks"
