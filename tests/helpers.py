"""Statistical assertions shared by the test suite.

Tolerances are derived from the sample size: the Kolmogorov–Smirnov critical value at level
``alpha`` is sqrt(ln(2/alpha) / 2) / sqrt(n) (Dvoretzky–Kiefer–Wolfowitz–Massart), so a test
with a fixed key fails with probability at most ``alpha`` when the code is right, and the same
samples must be rejected against a wrongly scaled reference.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from fractions import Fraction

import numpy as np
from scipy import stats


def ks_statistic(samples, cdf: Callable[[np.ndarray], np.ndarray]) -> float:
    """Two-sided KS distance between the empirical CDF of ``samples`` and ``cdf``."""
    x = np.sort(np.asarray(samples, dtype=np.float64).ravel())
    n = x.size
    f = np.asarray(cdf(x), dtype=np.float64)
    upper = np.arange(1, n + 1) / n - f
    lower = f - np.arange(0, n) / n
    return float(max(upper.max(), lower.max()))


def ks_critical(n: int, alpha: float = 1e-4) -> float:
    """DKW–Massart bound: P[KS > this] ≤ alpha under the null."""
    return math.sqrt(math.log(2.0 / alpha) / 2.0) / math.sqrt(n)


def assert_distribution(samples, cdf, *, wrong_cdfs=(), alpha: float = 1e-4) -> None:
    """Samples follow ``cdf`` and are distinguishable from every cdf in ``wrong_cdfs``."""
    n = np.asarray(samples).size
    crit = ks_critical(n, alpha)
    stat = ks_statistic(samples, cdf)
    assert stat <= crit, f"KS {stat:.4g} > critical {crit:.4g} (n={n}): wrong distribution"
    for wrong in wrong_cdfs:
        stat_wrong = ks_statistic(samples, wrong)
        assert stat_wrong > crit, (
            f"KS vs a wrong reference {stat_wrong:.4g} <= {crit:.4g}: test has no power"
        )


def mean_tolerance(std: float, n: int, z: float = 5.0) -> float:
    """z standard errors of a sample mean."""
    return z * std / math.sqrt(n)


def assert_frequencies(counts, probs, *, wrong_probs=(), alpha=1e-4):
    """Pearson chi-square: counts follow probs, and are distinguishable from wrong_probs."""
    counts = np.asarray(counts, dtype=np.float64)
    n = counts.sum()
    crit = stats.chi2.ppf(1.0 - alpha, df=counts.size - 1)

    def statistic(p):
        expected = n * np.asarray(p, dtype=np.float64)
        return float(np.sum((counts - expected) ** 2 / expected))

    assert statistic(probs) <= crit, f"chi2 {statistic(probs):.4g} > {crit:.4g}"
    for wrong in wrong_probs:
        assert statistic(wrong) > crit, "chi-square has no power against a wrong distribution"


def float32_at_or_above(x: float) -> np.float32:
    """The smallest float32 ≥ x, decided in exact rationals (not by the code under test)."""
    nearest = np.float32(x)
    if Fraction(float(nearest)) < Fraction(x):
        return np.nextafter(nearest, np.float32(np.inf))
    return nearest
