"""Per-document loss sums: merging batches, means, and the statistics of the sweep JSON."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline_lib.evaluate.heff_stats import DocumentAccumulator, loss_statistics


def test_accumulator_merges_documents_across_batches():
    acc = DocumentAccumulator([4, 1])
    acc.add(np.array([7, 3, 7]), np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]))
    acc.add(np.array([], dtype=np.int64), np.zeros((0, 2)))
    acc.add(np.array([3, 9]), np.array([[0.5, 0.25], [1.0, 1.0]]))
    levels = np.full(10, -1)
    levels[[3, 7]] = [2, 5]
    docs = acc.finish(levels)
    assert docs.h_effs == [1, 4]
    assert docs.tokens.tolist() == [2, 2, 1]  # documents 3, 7, 9
    assert docs.loss_sums.tolist() == [[3.5, 4.25], [6.0, 8.0], [1.0, 1.0]]
    assert docs.levels.tolist() == [2, 5, -1]
    assert docs.means() == {1: 10.5 / 5, 4: 13.25 / 5}


def test_loss_statistics_paired_and_by_level():
    rng = np.random.default_rng(0)
    n = 120
    tokens = rng.integers(5, 40, n)
    base = rng.normal(2.0, 0.2, n) * tokens
    deeper = base - 0.1 * tokens  # 0.1 nats lower on every document
    acc = DocumentAccumulator([1, 4])
    acc.add(np.arange(n), np.zeros((n, 2)))  # register documents; sums set below
    docs = acc.finish(np.arange(n) % 2)  # two levels
    docs.loss_sums = np.stack([base, deeper], axis=1).astype(float)
    docs.tokens = tokens.astype(np.int64)
    stats = loss_statistics(docs, iters=500)
    assert stats["documents"] == n and stats["paired_baseline"] == 1
    assert stats["paired"]["4"]["diff"] == pytest.approx(-0.1)
    assert stats["paired"]["4"]["lo"] == pytest.approx(-0.1) == stats["paired"]["4"]["hi"]
    assert 0 < stats["stderr"]["1"] < 0.1
    assert set(stats["losses_by_level"]) == {"0", "1"}
    even = stats["losses_by_level"]["0"]
    assert even["tokens"] == int(tokens[::2].sum()) and even["documents"] == n // 2
    assert even["losses"]["1"] == pytest.approx(base[::2].sum() / tokens[::2].sum())
    docs.levels = np.full(n, -1)
    assert "losses_by_level" not in loss_statistics(docs, iters=50)
