"""Intervals and paired comparisons against textbook values."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest

from pipeline_lib.evaluate.stats import (
    bootstrap_stderr,
    document_bootstrap,
    mcnemar_exact,
    paired_bootstrap,
    paired_column_diffs,
    score_interval,
    wilson_interval,
)


@pytest.mark.parametrize("k, n, lo, hi", [
    (0, 10, 0.0, 0.2775),  # Wilson 95% intervals as tabulated (e.g. Newcombe 1998)
    (5, 10, 0.2366, 0.7634),
    (10, 10, 0.7225, 1.0),
    (81, 263, 0.2553, 0.3662),
])
def test_wilson_textbook_values(k, n, lo, hi):
    got = wilson_interval(k, n)
    assert got == pytest.approx((lo, hi), abs=1e-4)


def test_wilson_edge_cases():
    assert all(math.isnan(v) for v in wilson_interval(0, 0))
    with pytest.raises(ValueError, match="0 <= k <= n"):
        wilson_interval(11, 10)
    assert score_interval([1, 0, 1, 1, 0, 1, 1, 0, 1, 0]) == wilson_interval(6, 10)


def test_paired_bootstrap_identical_and_clear_difference():
    rng = np.random.default_rng(1)
    a = (rng.random(200) < 0.5).astype(float)
    same = paired_bootstrap(a, a)
    assert (same.diff, same.lo, same.hi) == (0.0, 0.0, 0.0) and not same.significant
    better = np.where(rng.random(200) < 0.4, 1.0, a)  # flips 0 → 1 on ~40% of examples
    d = paired_bootstrap(better, a)
    assert d.diff == pytest.approx((better - a).mean())
    assert 0 < d.lo < d.diff < d.hi and d.significant
    worse = paired_bootstrap(a, better)
    assert worse.hi < 0 and worse.significant
    assert paired_bootstrap(better, a) == d  # seeded: reproducible


def test_paired_bootstrap_noise_is_not_significant():
    rng = np.random.default_rng(2)
    a = (rng.random(100) < 0.5).astype(float)
    b = (rng.random(100) < 0.5).astype(float)
    d = paired_bootstrap(a, b)
    assert d.lo < 0 < d.hi or abs(d.diff) > 0.15  # independent coins: 0 inside, almost surely


def test_mcnemar_exact():
    a = np.array([1] * 10 + [0] * 2 + [1] * 5 + [0] * 3, dtype=float)
    b = np.array([0] * 10 + [1] * 2 + [1] * 5 + [0] * 3, dtype=float)
    assert mcnemar_exact(a, b) == pytest.approx(2 * (1 + 12 + 66) / 4096)  # 10 vs 2 discordant
    assert mcnemar_exact(a, a) == 1.0
    with pytest.raises(ValueError, match="0/1"):
        mcnemar_exact([0.5], [1.0])


def test_document_bootstrap_stderr_matches_formula():
    rng = np.random.default_rng(3)
    docs = 400
    tokens = np.full(docs, 10.0)
    per_doc_mean = rng.normal(2.0, 0.5, docs)
    sums = per_doc_mean * tokens
    se = bootstrap_stderr(document_bootstrap(sums, tokens, iters=4000))
    expected = per_doc_mean.std() / math.sqrt(docs)  # equal weights: SE of a plain mean
    assert se.shape == (1,) and se[0] == pytest.approx(expected, rel=0.08)
    reps = document_bootstrap(np.stack([sums, 2 * sums], axis=1), tokens, iters=50)
    assert reps.shape == (50, 2) and np.allclose(reps[:, 1], 2 * reps[:, 0])  # same resamples


def _paired_token_mean_diff(sums_a, sums_b, tokens):
    """mean_a − mean_b of two token-weighted losses over the same documents, 95% interval."""
    reps = document_bootstrap(np.stack([sums_a, sums_b], axis=1), tokens)
    point = np.array([sums_a.sum(), sums_b.sum()]) / tokens.sum()
    return paired_column_diffs(reps, point, base=1)[0]


def test_token_weighted_paired_diff():
    rng = np.random.default_rng(4)
    tokens = rng.integers(5, 50, 300).astype(float)
    base = rng.normal(2.0, 0.3, 300) * tokens
    same = _paired_token_mean_diff(base, base, tokens)
    assert (same.diff, same.lo, same.hi) == (0.0, 0.0, 0.0)
    lower = base - 0.05 * tokens * rng.uniform(0.5, 1.5, 300)  # deeper: ~0.05 nats lower
    d = _paired_token_mean_diff(lower, base, tokens)
    assert d.diff == pytest.approx(lower.sum() / tokens.sum() - base.sum() / tokens.sum())
    assert d.lo < d.diff < d.hi < 0 and d.significant


def test_stats_module_does_not_import_torch():
    code = "import sys, pipeline_lib.evaluate.stats; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("values", [
    np.array([1.0] * 150 + [0.0] * 350),  # few distinct values: multinomial resampling
    np.random.default_rng(5).normal(0.3, 0.46, 500),  # many: index resampling
])
def test_bootstrap_means_spread_matches_the_standard_error(values):
    from pipeline_lib.evaluate.stats import bootstrap_means

    reps = bootstrap_means(values, iters=4000, seed=1)
    assert reps.shape == (4000,) and reps.mean() == pytest.approx(values.mean(), abs=0.003)
    assert reps.std() == pytest.approx(values.std() / math.sqrt(len(values)), rel=0.06)
