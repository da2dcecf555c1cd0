"""Confidence intervals and paired comparisons for evaluation numbers (numpy only, no torch).

- :func:`wilson_interval`: 95% interval of an accuracy k/n (Wilson score; sane at 0/n and n/n,
  where the normal approximation collapses to a zero-width interval).
- :func:`paired_bootstrap`: interval of the mean per-example difference a − b of two scorings
  of the SAME examples (e.g. correctness at H_eff=4 and at H_eff=1); pairing removes the
  between-example variance that two independent intervals would count twice.
- :func:`mcnemar_exact`: exact two-sided McNemar p-value of two paired 0/1 scorings.
- :func:`document_bootstrap`, :func:`bootstrap_stderr`, :func:`paired_column_diffs`:
  token-weighted mean losses (Σ loss / Σ tokens) resampled by DOCUMENT, since tokens of one
  document are not independent draws; paired across H_eff by reusing the same resamples.
  :func:`percentile_interval` of such replicates: a token-weighted accuracy's interval.

Every bootstrap is seeded: the same inputs give the same interval on every machine.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

Z95 = 1.959963984540054  # two-sided 95% normal quantile
BOOTSTRAP_ITERS = 2000
BOOTSTRAP_SEED = 0
_CHUNK_ELEMENTS = 4_000_000  # resample matrix size per chunk (iterations × items)
_FEW_VALUES = 16  # up to this many distinct values, resample by multinomial counts


@dataclass(frozen=True)
class Difference:
    """Mean paired difference and its 95% interval."""

    diff: float
    lo: float
    hi: float

    @property
    def significant(self) -> bool:
        """The interval excludes zero (strictly)."""
        return self.lo > 0 or self.hi < 0

    def to_json(self) -> dict[str, float]:
        return {"diff": self.diff, "lo": self.lo, "hi": self.hi}


def wilson_interval(k: float, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval of a proportion k/n; (nan, nan) when n = 0."""
    if n <= 0:
        return math.nan, math.nan
    if not 0 <= k <= n:
        raise ValueError(f"need 0 <= k <= n, got k={k}, n={n}")
    p = k / n
    z2 = z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z / (1 + z2 / n) * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n))
    return max(0.0, centre - half), min(1.0, centre + half)


def is_binary(values: Sequence[float] | np.ndarray) -> bool:
    """Every value is 0 or 1 (a correctness indicator)."""
    arr = np.asarray(values, dtype=float)
    return bool(np.all((arr == 0.0) | (arr == 1.0)))


def _resample_counts(rng: np.random.Generator, n: int, iters: int):
    """Yield [chunk, n] multiplicity matrices of ``iters`` bootstrap resamples of n items."""
    chunk = max(1, min(iters, _CHUNK_ELEMENTS // max(n, 1)))
    done = 0
    while done < iters:
        c = min(chunk, iters - done)
        idx = rng.integers(0, n, size=(c, n)) + (np.arange(c) * n)[:, None]
        yield np.bincount(idx.ravel(), minlength=c * n).reshape(c, n).astype(np.float64)
        done += c


def bootstrap_means(values: np.ndarray, iters: int = BOOTSTRAP_ITERS,
                    seed: int = BOOTSTRAP_SEED) -> np.ndarray:
    """Bootstrap replicates of the mean of ``values`` [n] or of each column of [n, k]."""
    values = np.asarray(values, dtype=np.float64)
    n = values.shape[0]
    if n == 0:
        raise ValueError("cannot bootstrap an empty sample")
    rng = np.random.default_rng(seed)
    if values.ndim == 1:
        uniq, freq = np.unique(values, return_counts=True)
        if len(uniq) <= _FEW_VALUES:
            # Few distinct values (0/1 scores, their differences): a resample is a multinomial
            # draw of how often each value appears, the same distribution at O(iters) cost.
            return rng.multinomial(n, freq / n, size=iters) @ uniq / n
    reps = [counts @ values / n for counts in _resample_counts(rng, n, iters)]
    return np.concatenate(reps, axis=0)


def mean_interval(values: Sequence[float] | np.ndarray, iters: int = BOOTSTRAP_ITERS,
                  seed: int = BOOTSTRAP_SEED) -> tuple[float, float]:
    """95% percentile-bootstrap interval of a mean (for non-binary per-example scores)."""
    lo, hi = percentile_interval(bootstrap_means(np.asarray(values, dtype=np.float64), iters,
                                                 seed))
    return float(lo), float(hi)


def percentile_interval(reps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """95% percentile interval (lo, hi) of bootstrap replicates [iters] or of each column of
    [iters, k] (NaN replicates ignored)."""
    lo, hi = np.nanquantile(reps, [0.025, 0.975], axis=0)
    return lo, hi


def score_interval(values: Sequence[float] | np.ndarray) -> tuple[float, float]:
    """95% interval of a mean score: Wilson for 0/1 scores, percentile bootstrap otherwise."""
    arr = np.asarray(values, dtype=np.float64)
    if is_binary(arr):
        return wilson_interval(float(arr.sum()), len(arr))
    return mean_interval(arr)


def paired_bootstrap(a: Sequence[float] | np.ndarray, b: Sequence[float] | np.ndarray,
                     iters: int = BOOTSTRAP_ITERS, seed: int = BOOTSTRAP_SEED) -> Difference:
    """Mean of a − b over paired examples with its 95% percentile-bootstrap interval."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"paired samples need equal 1-D shapes, got {a.shape} and {b.shape}")
    d = a - b
    lo, hi = percentile_interval(bootstrap_means(d, iters, seed))
    return Difference(float(d.mean()), float(lo), float(hi))


def mcnemar_exact(a: Sequence[float] | np.ndarray, b: Sequence[float] | np.ndarray) -> float:
    """Exact two-sided McNemar p-value of paired 0/1 outcomes (binomial test on discordants)."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if a.shape != b.shape or not (is_binary(a) and is_binary(b)):
        raise ValueError("McNemar's test needs two paired 0/1 arrays of equal length")
    only_a = int(((a == 1) & (b == 0)).sum())
    only_b = int(((a == 0) & (b == 1)).sum())
    n = only_a + only_b
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(only_a, only_b) + 1))
    return min(1.0, 2 * tail / 2 ** n)


# --------------------------------------------------------------------------- token-weighted


def document_bootstrap(loss_sums: np.ndarray, tokens: np.ndarray, iters: int = BOOTSTRAP_ITERS,
                       seed: int = BOOTSTRAP_SEED) -> np.ndarray:
    """Replicates [iters, k] of Σ loss / Σ tokens with documents resampled with replacement.

    ``loss_sums``: [docs] or [docs, k] (k losses per document, e.g. one per H_eff, all
    resampled together so that differences between columns are paired); ``tokens``: [docs].
    """
    sums = np.asarray(loss_sums, dtype=np.float64)
    sums = sums[:, None] if sums.ndim == 1 else sums
    toks = np.asarray(tokens, dtype=np.float64)
    if sums.shape[0] != toks.shape[0] or sums.shape[0] == 0:
        raise ValueError(f"need one token count per document, got {sums.shape[0]} documents "
                         f"and {toks.shape[0]} counts")
    rng = np.random.default_rng(seed)
    reps = []
    for counts in _resample_counts(rng, len(toks), iters):
        denom = counts @ toks
        denom[denom == 0] = np.nan  # only possible with zero-token documents
        reps.append((counts @ sums) / denom[:, None])
    return np.concatenate(reps, axis=0)


def bootstrap_stderr(reps: np.ndarray) -> np.ndarray:
    """Standard error [k] of each column of bootstrap replicates [iters, k] (0 with one)."""
    return np.nanstd(reps, axis=0, ddof=1) if len(reps) > 1 else np.zeros(reps.shape[1])


def paired_column_diffs(reps: np.ndarray, point: np.ndarray, base: int) -> list[Difference]:
    """Column j − column ``base`` of bootstrap replicates [iters, k] with point estimates [k]."""
    lo, hi = percentile_interval(reps - reps[:, base:base + 1])
    return [Difference(float(point[j] - point[base]), float(lo[j]), float(hi[j]))
            for j in range(reps.shape[1])]
