"""ExitSpec: the one parser and formatter of ``adaptive:[CRITERION:]THRESHOLD[:MAX]``, and
the specs a config section gives."""

from __future__ import annotations

import subprocess
import sys

import pytest

from pipeline_lib.errors import ConfigError
from pipeline_lib.evaluate.exit.spec import ExitSpec
from pipeline_lib.spec.config import AdaptiveExitConfig, BenchConfig, EvalConfig


@pytest.mark.parametrize(("text", "criterion", "want"), [
    ("adaptive:0.01", "kl", ExitSpec((0.01,), "kl", 0)),
    ("Adaptive:0:8", "kl", ExitSpec((0.0,), "kl", 8)),
    ("adaptive:0.01", "entropy", ExitSpec((0.01,), "entropy", 0)),
    ("adaptive:gate:0.9:6", "kl", ExitSpec((0.9,), "gate", 6)),
    (" adaptive : argmax_stable : 2 ", "kl", ExitSpec((2.0,), "argmax_stable", 0)),
])
def test_parse(text, criterion, want):
    assert ExitSpec.parse(text, criterion=criterion) == want


@pytest.mark.parametrize("bad", ["adaptive", "adaptive:x", "adaptive:0.1:two", "adaptive:-1",
                                 "adaptive:0.1:0", "adaptive:inf", "fast:0.1", "adaptive:1:2:3",
                                 "adaptive:0.1:2000"])
def test_bad_text_names_value_and_fix(bad):
    with pytest.raises(ConfigError) as info:
        ExitSpec.parse(bad, "--h-eff")
    message = str(info.value)
    assert repr(bad) in message and "\n" not in message
    assert "adaptive:THRESHOLD" in message or "between 1 and 1024" in message


def test_gate_threshold_is_a_probability():
    with pytest.raises(ConfigError, match=r"probability in \[0, 1\].*adaptive:gate:0.9"):
        ExitSpec.parse("adaptive:gate:2", "h_eff")


def test_text_round_trips_and_names_only_another_criterion():
    spec = ExitSpec.parse("adaptive:entropy:0.5").with_max_loops(4)
    assert spec.text() == "adaptive:entropy:0.5:4" and spec.text("entropy") == "adaptive:0.5:4"
    assert ExitSpec.parse(spec.text()) == spec
    assert ExitSpec.parse("adaptive:1e-05:3").text() == "adaptive:1e-05:3"
    assert ExitSpec.parse("adaptive:0.1:3").with_max_loops(9).max_loops == 3  # MAX given wins


def test_points_are_distinct_and_increasing():
    spec = ExitSpec((0.1, 0.0, 0.1), "cosine", 5)
    assert spec.points() == [ExitSpec((0.0,), "cosine", 5), ExitSpec((0.1,), "cosine", 5)]


def test_is_text():
    assert ExitSpec.is_text(" Adaptive:0.1") and not ExitSpec.is_text("4")
    assert not ExitSpec.is_text(4)


def test_spec_module_is_torch_free():
    code = ("import sys; import pipeline_lib.evaluate.exit.spec; "
            "print('torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)
    assert done.stdout.strip() == "False"


def test_one_spec_per_criterion_of_a_config_section():
    adaptive = EvalConfig().adaptive
    adaptive.criteria = ["kl", "argmax_stable", "gate", "kl"]
    assert ExitSpec.from_config(adaptive) == [
        ExitSpec(tuple(adaptive.thresholds), "kl", 0), ExitSpec((0, 1, 2, 3), "argmax_stable", 0),
        ExitSpec((1.0, 0.99, 0.9, 0.5), "gate", 0)]
    assert ExitSpec.from_config(EvalConfig().adaptive) == [
        ExitSpec((0.0, 1e-4, 1e-3, 1e-2, 0.1), "kl", 0)]
    on = AdaptiveExitConfig(criteria=["entropy"], thresholds=[0.0, 0.1], max_loops=5)
    assert ExitSpec.from_config(on) == [ExitSpec((0.0, 0.1), "entropy", 5)]


def test_empty_thresholds_turn_adaptive_exit_off():
    assert ExitSpec.from_config(BenchConfig().adaptive) == []
    off = AdaptiveExitConfig(criteria=["gate"], criterion_thresholds={"gate": [0.9]})
    assert ExitSpec.from_config(off) == []  # thresholds [] is off, whatever the criteria


def test_resolved_sorts_dedupes_and_fills_max_loops():
    resolved = ExitSpec((0.1, 0.0, 0.1), "entropy", 0).resolved([1, 4, 12])
    assert resolved == ExitSpec((0.0, 0.1), "entropy", 12)
    assert ExitSpec((0.5,), "kl", 3).resolved([8]).max_loops == 3
