"""Slopes of mean excess risk on log–log axes, with hierarchical-bootstrap confidence intervals.

The rate experiments measure, in each cell of a grid (one value of n, d or ε), an array of
excess risks of shape ``(K, S)``: K independently generated data sets × S noise seeds per data
set. This module turns a row of such cells into the numbers the report shows:

* the OLS slope of ``log2(mean excess)`` against ``log2(x)`` (means, never medians: the
  theorems bound expectations);
* a percentile 95% CI for that slope from a **hierarchical bootstrap** (resample data sets,
  then seeds within each resampled data set, independently in every cell);
* the local slopes between consecutive grid points (they expose curvature);
* per cell, a one-sided upper confidence bound on the mean (Student t over the K·S runs) and a
  Holm–Bonferroni decision "the measured mean is below the stated bound" over the cells of a
  row.

Everything here is host-side NumPy in float64.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy import stats

__all__ = [
    "ols_slope",
    "log_log_slope",
    "local_slopes",
    "hierarchical_bootstrap_slopes",
    "slope_with_ci",
    "mean_with_ci",
    "upper_confidence_bound",
    "holm_bound_held",
    "holm_bound_violated",
]


def ols_slope(x: Sequence[float], y: Sequence[float]) -> tuple[float, float]:
    """Least-squares line ``y ≈ a + s x``.

    Args:
        x: abscissae (at least two distinct values).
        y: ordinates, same length.

    Returns:
        ``(s, a)``: slope and intercept.
    """
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if x.shape != y.shape or x.ndim != 1 or np.unique(x).size < 2:
        raise ValueError(f"x must be a 1-d array with >= 2 distinct values matching y; got {x!r}")
    xc = x - x.mean()
    slope = float(np.dot(xc, y - y.mean()) / np.dot(xc, xc))
    return slope, float(y.mean() - slope * x.mean())


def log_log_slope(xs: Sequence[float], means: Sequence[float]) -> tuple[float, float]:
    """OLS fit of ``log2(mean) = a + s·log2(x)``; returns ``(s, a)``.

    Example:
        >>> round(log_log_slope([1, 2, 4, 8], [1.0, 0.25, 0.0625, 0.015625])[0], 6)
        -2.0
    """
    means = np.asarray(means, dtype=np.float64)
    if np.any(means <= 0):
        raise ValueError(f"means must be positive to take logs; got {means!r}")
    return ols_slope(np.log2(np.asarray(xs, dtype=np.float64)), np.log2(means))


def local_slopes(xs: Sequence[float], means: Sequence[float]) -> list[float]:
    """Slopes between consecutive points: ``Δ log2(mean) / Δ log2(x)``."""
    lx = np.log2(np.asarray(xs, dtype=np.float64))
    ly = np.log2(np.asarray(means, dtype=np.float64))
    return [float(v) for v in np.diff(ly) / np.diff(lx)]


def _resampled_means(samples: np.ndarray, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """``n_boot`` hierarchical-bootstrap means of a ``(K, S)`` array: data sets, then seeds."""
    k, s = samples.shape
    datasets = rng.integers(0, k, size=(n_boot, k))
    seeds = rng.integers(0, s, size=(n_boot, k, s))
    picked = samples[datasets[:, :, None], seeds]
    return picked.mean(axis=(1, 2))


def hierarchical_bootstrap_slopes(
    xs: Sequence[float],
    samples: Sequence[np.ndarray],
    *,
    n_boot: int = 2000,
    rng: np.random.Generator,
) -> np.ndarray:
    """Bootstrap distribution of the log–log OLS slope.

    Each cell's ``(K, S)`` array is resampled independently (data sets with replacement, then
    seeds with replacement within each picked data set), its mean taken, and the slope refitted.

    Args:
        xs: grid values (n, d or ε), one per cell.
        samples: one ``(K, S)`` array of excess risks per cell.
        n_boot: number of bootstrap replicates.
        rng: NumPy generator (the caller seeds it).

    Returns:
        Array of ``n_boot`` slopes (replicates with a non-positive mean are dropped).
    """
    if len(xs) != len(samples) or len(xs) < 2:
        raise ValueError(f"xs must match samples and have >= 2 cells; got {len(xs)} cells")
    lx = np.log2(np.asarray(xs, dtype=np.float64))
    means = np.stack(
        [_resampled_means(np.asarray(c, dtype=np.float64), n_boot, rng) for c in samples], axis=1
    )
    ok = np.all(means > 0, axis=1)
    ly = np.log2(means[ok])
    xc = lx - lx.mean()
    return (ly - ly.mean(axis=1, keepdims=True)) @ xc / np.dot(xc, xc)


def slope_with_ci(
    xs: Sequence[float],
    samples: Sequence[np.ndarray],
    *,
    n_boot: int = 2000,
    level: float = 0.95,
    seed: int = 0,
) -> dict:
    """Point slope of the means, percentile CI, and local slopes of a row of cells.

    Returns:
        dict with ``slope``, ``intercept``, ``ci_low``, ``ci_high``, ``means``, ``local_slopes``.
    """
    means = [float(np.mean(c)) for c in samples]
    slope, intercept = log_log_slope(xs, means)
    boot = hierarchical_bootstrap_slopes(
        xs, samples, n_boot=n_boot, rng=np.random.default_rng(seed)
    )
    tail = 100.0 * (1.0 - level) / 2.0
    low, high = np.percentile(boot, [tail, 100.0 - tail])
    return {
        "slope": slope,
        "intercept": intercept,
        "ci_low": float(low),
        "ci_high": float(high),
        "means": means,
        "local_slopes": local_slopes(xs, means),
    }


def mean_with_ci(
    samples: np.ndarray, *, n_boot: int = 2000, level: float = 0.95, seed: int = 0
) -> tuple[float, float, float]:
    """Mean of a ``(K, S)`` cell and its percentile CI from the hierarchical bootstrap.

    The same resampling as the slope CI (data sets, then seeds within each), so the error bars
    of the plots and the slope's CI come from one model of the run-to-run variation.

    Args:
        samples: ``(K, S)`` excess risks of one cell.
        n_boot: bootstrap replicates.
        level: two-sided confidence level.
        seed: seeds the resampling.

    Returns:
        ``(mean, low, high)``.

    Example:
        >>> m, lo, hi = mean_with_ci(np.arange(12.0).reshape(3, 4), n_boot=500)
        >>> bool(lo < m < hi), m
        (True, 5.5)
    """
    samples = np.asarray(samples, dtype=np.float64)
    if samples.ndim != 2:
        raise ValueError(f"samples must be a (K, S) array; got shape {samples.shape}")
    boot = _resampled_means(samples, n_boot, np.random.default_rng(seed))
    tail = 100.0 * (1.0 - level) / 2.0
    low, high = np.percentile(boot, [tail, 100.0 - tail])
    return float(samples.mean()), float(low), float(high)


def upper_confidence_bound(samples: np.ndarray, level: float = 0.99) -> float:
    """One-sided Student-t upper confidence bound on the mean of all runs of a cell."""
    x = np.asarray(samples, dtype=np.float64).ravel()
    se = x.std(ddof=1) / math.sqrt(x.size)
    return float(x.mean() + stats.t.ppf(level, x.size - 1) * se)


def _p_value_below(samples: np.ndarray, bound: float) -> float:
    """p-value of H0: E[excess] ≥ bound against H1: E[excess] < bound (one-sided t test)."""
    x = np.asarray(samples, dtype=np.float64).ravel()
    se = x.std(ddof=1) / math.sqrt(x.size)
    if se == 0.0:
        return 0.0 if x.mean() < bound else 1.0
    return float(stats.t.cdf((x.mean() - bound) / se, x.size - 1))


def holm_bound_held(
    samples: Sequence[np.ndarray], bounds: Sequence[float], alpha: float = 0.01
) -> list[bool]:
    """Per cell, whether "mean excess < bound" is established at family-wise level ``alpha``.

    One-sided t tests of H0: E[excess] ≥ U in every cell, Holm–Bonferroni step-down over the
    cells (a cell "holds" when its H0 is rejected). With one cell this is the 99% one-sided
    upper confidence bound being below U.
    """
    p = np.array([_p_value_below(c, u) for c, u in zip(samples, bounds, strict=True)])
    held = np.zeros(p.size, dtype=bool)
    for rank, idx in enumerate(np.argsort(p)):
        if p[idx] > alpha / (p.size - rank):
            break
        held[idx] = True
    return [bool(h) for h in held]


def _p_value_above(samples: np.ndarray, bound: float) -> float:
    """p-value of H0: E[excess] ≤ bound against H1: E[excess] > bound (one-sided t test)."""
    return 1.0 - _p_value_below(samples, bound)


def holm_bound_violated(
    samples: Sequence[np.ndarray], bounds: Sequence[float], alpha: float = 0.01
) -> list[bool]:
    """Per cell, whether "mean excess > bound" is established at family-wise level ``alpha``.

    One-sided t tests of H0: E[excess] ≤ U, Holm–Bonferroni over the cells of a row. A bound
    "holds" in a cell unless this rejects: a sample mean a little above a nearly tight bound is
    not evidence of a violation (``holm_bound_held`` is the stricter, positive check).
    """
    p = np.array([_p_value_above(c, u) for c, u in zip(samples, bounds, strict=True)])
    violated = np.zeros(p.size, dtype=bool)
    for rank, idx in enumerate(np.argsort(p)):
        if p[idx] > alpha / (p.size - rank):
            break
        violated[idx] = True
    return [bool(v) for v in violated]
