"""Intervals of benchmark scores and paired H_eff comparisons."""

from __future__ import annotations

import math

import pytest

from pipeline_lib.bench.intervals import find_comparison, interval_fields, paired_comparisons
from pipeline_lib.evaluate.stats import wilson_interval


def test_interval_fields():
    assert interval_fields([1.0, 0.0, 1.0, 1.0]) == {
        "n": 4, **dict(zip(("ci_low", "ci_high"), wilson_interval(3, 4), strict=True))}
    graded = interval_fields([0.2, 0.4, 0.6, 0.9])  # not 0/1: percentile bootstrap
    assert graded["n"] == 4 and 0.2 <= graded["ci_low"] < 0.525 < graded["ci_high"] <= 0.9
    empty = interval_fields([])
    assert empty["n"] == 0 and math.isnan(empty["ci_low"])


def test_paired_comparisons_use_only_shared_examples():
    per_h = {4: {"a": 1.0, "b": 1.0, "c": 0.5}, 1: {"a": 0.0, "b": 1.0, "d": 1.0}}
    records = paired_comparisons(per_h, {"a": 1, "b": 2, "c": 2, "d": 1})
    whole = find_comparison(records, 4, 1, None)
    assert whole["n"] == 2 and whole["diff"] == 0.5 and whole["p_mcnemar"] == 1.0
    assert find_comparison(records, 4, 1, 2)["diff"] == 0.0
    assert find_comparison(records, 4, 1, 3) is None
    assert paired_comparisons({1: {"a": 1.0}}) == []
    graded = paired_comparisons({1: {"a": 0.5}, 2: {"a": 0.75}})
    assert graded[0]["diff"] == pytest.approx(0.25) and graded[0]["p_mcnemar"] is None
