"""The ℓ2 sensitivity of a matrix-factorization strategy, single or b-min-separated participation.

One example's clipped gradients enter the stream G at the steps where it participates. A
participation pattern π is a set of steps; with (b, k)-participation (b-min-separated, at most k
participations) any two steps of π are at least b apart and |π| ≤ k (Choquette-Choo, McMahan,
Rush, Thakurta 2023, "Multi-epoch matrix factorization mechanisms for private machine learning",
ICML, Section 2). Under add/remove-one neighbouring the example changes G by one vector g_t of
norm ≤ 1 (in units of the clip norm) at each t ∈ π, so the release C·G + Z changes by
Σ_{t∈π} C[:, t] g_tᵀ and the sensitivity is

.. math::  \\mathrm{sens}(C)^2 = \\max_{\\pi}\\ \\max_{\\|g_t\\|\\le 1}
    \\sum_{s,t\\in\\pi} (C^\\top C)_{st}\\,\\langle g_s, g_t\\rangle .

Under replace-one each difference has norm ≤ 2: multiply by 2.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from dpjax import _validate

__all__ = ["SensitivityBounds", "sensitivity", "sensitivity_bounds"]

_ENUMERATION_LIMIT = 20_000
_EXACT_RTOL = 1e-9


class SensitivityBounds(NamedTuple):
    """Bounds on the sensitivity of a strategy.

    Attributes:
        lower: a participation pattern achieves at least this (with all g_t equal).
        upper: a certified upper bound (float64 rounding accounted for).
        exact: whether ``upper`` is the sensitivity itself (up to the rounding slack): the
            bounds met, or the Gram CᵀC is non-negative and every pattern was enumerated.
    """

    lower: float
    upper: float
    exact: bool


def _matrix(strategy) -> np.ndarray:
    c = np.asarray(strategy, dtype=np.float64)
    if c.ndim != 2 or c.size == 0 or not np.all(np.isfinite(c)):
        _validate.fail("strategy", strategy, "a non-empty 2-D array of finite reals")
    return c


def _pattern(n: int, min_separation, max_participations) -> tuple[int, int]:
    k = _validate.positive_int("max_participations", max_participations)
    if min_separation is None:
        return 1, k
    b = _validate.positive_int("min_separation", min_separation)
    return b, k


def _round_up(value: float, terms: int) -> float:
    """``value`` (a float64 sum of ``terms`` non-negative terms) inflated past its rounding."""
    slack = 1.0 + 4.0 * (terms + 4) * np.finfo(np.float64).eps
    return float(np.nextafter(value * slack, np.inf))


def _best_separated_sums(weights: np.ndarray, b: int, k: int) -> tuple[np.ndarray, list]:
    """max over b-separated index sets S, |S| ≤ k, of Σ_{j∈S} w_j, for each row of ``weights``.

    Dynamic programme over positions from the right: best[j][m] = max(best[j+1][m],
    w_j + best[j+b][m−1]); weights must be non-negative. Also returns the maximising set of the
    first row.
    """
    rows, n = weights.shape
    keep_all = rows == 1
    zero = np.zeros((k + 1, rows))
    best: dict[int, np.ndarray] = {}
    for j in range(n - 1, -1, -1):
        here = np.empty((k + 1, rows))
        here[0] = 0.0
        take = weights[:, j][None, :] + best.get(j + b, zero)[:-1]
        here[1:] = np.maximum(best.get(j + 1, zero)[1:], take)
        best[j] = here
        if not keep_all:
            best.pop(j + b, None)
    chosen, j, m = [], 0, k
    while keep_all and j < n and m > 0:
        if best[j][m, 0] > best.get(j + 1, zero)[m, 0]:
            chosen.append(j)
            j, m = j + b, m - 1
        else:
            j += 1
    return best[0][k], chosen


def _patterns(n: int, b: int, k: int, limit: int) -> list[tuple[int, ...]] | None:
    """All maximal-size-≤k b-separated patterns, or None if there are more than ``limit``."""
    out: list[tuple[int, ...]] = []

    def extend(prefix: tuple[int, ...], start: int) -> bool:
        if prefix:
            out.append(prefix)
            if len(out) > limit:
                return False
        if len(prefix) == k:
            return True
        return all(extend(prefix + (j,), j + b) for j in range(start, n))

    return out if extend((), 0) else None


def _quadratic(gram: np.ndarray, pattern) -> float:
    idx = np.asarray(pattern)
    return float(gram[np.ix_(idx, idx)].sum())


def _candidates(n: int, b: int, k: int, dp_pattern: list[int]) -> list[list[int]]:
    cyclic = [list(range(s, n, b))[:k] for s in range(min(b, n))]
    return [p for p in [*cyclic, dp_pattern] if p]


def sensitivity_bounds(
    strategy, *, min_separation: int | None = None, max_participations: int = 1
) -> SensitivityBounds:
    """Lower and certified upper bounds on the ℓ2 sensitivity of ``strategy`` (see module doc).

    Single participation (``max_participations = 1``): the maximum column norm, exact.
    Multiple participation: with X = CᵀC, the upper bound replaces X by |X| (plus the float64
    error bound of the Gram), which is exact when X ≥ 0 entrywise, and maximises over patterns
    by enumeration when there are at most 20 000 patterns, otherwise by a row relaxation
    max_π Σ_{s∈π} r_s with r_s = max_{π∋s} Σ_{t∈π} |X_st| (two dynamic programmes). The lower
    bound evaluates Σ_{s,t∈π} X_st on the cyclic patterns {s, s+b, ...} and the relaxation's
    maximiser (or on every pattern, when enumerated).

    Formal guarantees:
        ``upper`` ≥ the sensitivity for (b, k)-participation under add/remove-one: for unit
        g_t, Σ X_st⟨g_s, g_t⟩ ≤ Σ |X_st|, with equality for equal g_t when X ≥ 0
        (Choquette-Choo, McMahan, Rush, Thakurta 2023, ICML, Theorem 2); the relaxation bounds
        each row's contribution by its own maximum over patterns. Rounding: the computed Gram
        is within n·u·(|C|ᵀ|C|) of the exact one (Higham, "Accuracy and stability of numerical
        algorithms", Section 3.5), which is added before the maximisation, and the sums are
        rounded up.

    Args:
        strategy: the strategy matrix C (rows: outputs, columns: steps), finite reals.
        min_separation: b, the least gap between two participations; None means 1 (any
            distinct steps).
        max_participations: k ≥ 1, the most participations of one example.

    Returns:
        A :class:`SensitivityBounds`.

    Raises:
        ValueError: on a non-finite or non-2-D strategy, or a non-positive b or k.
    """
    c = _matrix(strategy)
    b, k = _pattern(c.shape[1], min_separation, max_participations)
    if k == 1:
        norm2 = np.einsum("ij,ij->j", c, c)
        lower = math.sqrt(float(norm2.max()))
        return SensitivityBounds(lower, math.sqrt(_round_up(float(norm2.max()), c.shape[0])), True)
    n = c.shape[1]
    gram = c.T @ c
    gamma = 1.01 * c.shape[0] * np.finfo(np.float64).eps
    absolute = np.abs(gram) + gamma * (np.abs(c).T @ np.abs(c))
    nonnegative = bool(np.all(gram >= 0))
    patterns = _patterns(n, b, k, _ENUMERATION_LIMIT)
    if patterns is not None:
        upper2 = max(_quadratic(absolute, p) for p in patterns)
        lower2 = max(_quadratic(gram, p) for p in patterns)
        exact = nonnegative
    else:
        lag = np.abs(np.subtract.outer(np.arange(n), np.arange(n)))
        others = np.where(lag >= b, absolute, 0.0)
        rows, _ = _best_separated_sums(others, b, k - 1)
        row_bound = np.diag(absolute) + rows
        upper2, dp_pattern = _best_separated_sums(row_bound[None, :], b, k)
        upper2 = float(upper2[0])
        lower2 = max(_quadratic(gram, p) for p in _candidates(n, b, k, dp_pattern))
        exact = lower2 >= upper2 * (1.0 - _EXACT_RTOL)
    upper = math.sqrt(_round_up(upper2, n + k * k))
    lower = math.sqrt(max(lower2, 0.0))
    return SensitivityBounds(min(lower, upper), upper, exact)


def sensitivity(
    strategy, *, min_separation: int | None = None, max_participations: int = 1
) -> float:
    """The ℓ2 sensitivity of x ↦ C·x for one example under (b, k)-participation, add/remove-one.

    .. math:: \\mathrm{sens}(C) = \\max_{\\pi}\\ \\max_{\\|g_t\\|\\le 1}
        \\big\\|\\textstyle\\sum_{t\\in\\pi} C[:, t]\\, g_t^\\top\\big\\|_F

    in units of the clip norm (replace-one: twice this). Single participation
    (``max_participations = 1``): the largest column norm. Multiple participation: exact when
    the Gram CᵀC is entrywise non-negative and the maximising pattern is certified (always for
    at most 20 000 patterns; for more, when the row relaxation meets a candidate pattern),
    otherwise a certified UPPER bound; :func:`sensitivity_bounds` says which.

    Formal guarantees:
        The value is ≥ the sensitivity (see :func:`sensitivity_bounds`; Choquette-Choo,
        McMahan, Rush, Thakurta 2023, ICML, Theorem 2), rounded up past float64 error, so a
        Gaussian mechanism calibrated to it is at least as private as claimed.

    Args:
        strategy: the strategy matrix C (rows: outputs, columns: steps), finite reals.
        min_separation: b, the least gap between two participations; None means 1.
        max_participations: k ≥ 1, the most participations of one example.

    Returns:
        The sensitivity (or its certified upper bound) as a Python float.

    Raises:
        ValueError: on a non-finite or non-2-D strategy, or a non-positive b or k.

    Example:
        >>> import numpy as np
        >>> round(sensitivity(np.eye(8), min_separation=2, max_participations=3), 9)
        1.732050808
    """
    return sensitivity_bounds(
        strategy, min_separation=min_separation, max_participations=max_participations
    ).upper
