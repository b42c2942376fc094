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
_NODE_BUDGET = 20_000


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


def _separated_columns_disjoint(c: np.ndarray, b: int) -> bool:
    """Whether any two columns at least b apart have disjoint row supports (e.g. ≤ b bands).

    Then the Gram of every pattern is diagonal and sens² is the largest sum of at most k
    squared column norms over b-separated columns, an O(n·k) dynamic programme.
    """
    nonzero = c != 0
    if not np.all(nonzero.any(axis=0)):
        return False
    rows = np.arange(c.shape[0])[:, None]
    first = np.where(nonzero, rows, c.shape[0]).min(axis=0)
    last = np.where(nonzero, rows, -1).max(axis=0)
    later_first = np.minimum.accumulate(first[::-1])[::-1]  # min over columns ≥ j
    if b >= c.shape[1]:
        return True
    return bool(np.all(last[: c.shape[1] - b] < later_first[b:]))


def _quadratic(gram: np.ndarray, pattern) -> float:
    idx = np.asarray(pattern)
    return float(gram[np.ix_(idx, idx)].sum())


def _branch_and_bound(absolute, row_bound, b, k, incumbent) -> list[int] | None:
    """The pattern maximising Σ_{s,t∈π} |X|_st, or None past ``_NODE_BUDGET`` nodes.

    Depth-first over patterns in increasing order. A node with chosen set P (value F(P)),
    h_j = Σ_{i∈P} |X|_ij and next free position ``start`` is bounded by
    F(P) + R(start, m) + (sum of the m largest h_j, j ≥ start), where m is the number of
    participations left and R the best b-separated sum of the row bounds r_j: for j added
    to P the new terms 2h_j + |X|_jj + Σ_{l∈S, l≠j} |X|_jl are at most r_j + h_j, because P ∪ S
    is a pattern containing j.
    """
    n = absolute.shape[0]
    suffix = np.zeros((n + b + 1, k + 1))
    for j in range(n - 1, -1, -1):
        suffix[j, 1:] = np.maximum(suffix[j + 1, 1:], row_bound[j] + suffix[j + b, :-1])
    diagonal = np.diag(absolute)
    best = [_quadratic(absolute, incumbent), list(incumbent)]
    nodes = [0]

    def visit(chosen, value, h, start, m) -> bool:
        nodes[0] += 1
        if nodes[0] > _NODE_BUDGET:
            return False
        if value > best[0]:
            best[0], best[1] = value, list(chosen)
        if m == 0 or start >= n:
            return True
        tail = h[start:]
        top = float(np.sum(np.partition(tail, -min(m, tail.size))[-min(m, tail.size) :]))
        if value + suffix[start, m] + top <= best[0]:
            return True
        order = start + np.argsort(-(2.0 * tail + diagonal[start:]), kind="stable")
        return all(
            visit(
                [*chosen, int(j)], value + 2.0 * h[j] + diagonal[j], h + absolute[j], j + b, m - 1
            )
            for j in order
        )

    return best[1] if visit([], 0.0, np.zeros(n), 0, k) else None


def _candidates(n: int, b: int, k: int, dp_pattern: list[int]) -> list[list[int]]:
    cyclic = [list(range(s, n, b))[:k] for s in range(min(b, n))]
    return [p for p in [*cyclic, dp_pattern] if p]


def sensitivity_bounds(
    strategy, *, min_separation: int | None = None, max_participations: int = 1
) -> SensitivityBounds:
    """Lower and certified upper bounds on the ℓ2 sensitivity of ``strategy`` (see module doc).

    Single participation (``max_participations = 1``): the maximum column norm, exact.
    Columns b or more apart with disjoint supports (a strategy with at most b bands): the
    patterns' Grams are diagonal, and the largest sum of k squared column norms over
    b-separated columns (a dynamic programme, O(n·k)) is exact. Otherwise, with X = CᵀC, the
    upper bound replaces X by |X| (plus the float64 error bound of the Gram), which is exact
    when X ≥ 0 entrywise, and maximises over patterns by enumeration when there are at most
    20 000 patterns, otherwise by a row relaxation max_π Σ_{s∈π} r_s with
    r_s = max_{π∋s} Σ_{t∈π} |X_st| (two dynamic programmes) and, when that is not met by a
    candidate pattern, by a branch and bound on the same bounds (at most 20 000 nodes; the
    relaxation stays the answer when the budget runs out). The lower bound evaluates
    Σ_{s,t∈π} X_st on the cyclic patterns {s, s+b, ...} and the relaxation's maximiser, or on
    the maximiser found by enumeration or branch and bound. Memory O(n²) for the Gram: n up
    to a few thousand.

    Formal guarantees:
        ``upper`` ≥ the sensitivity for (b, k)-participation under add/remove-one: for unit
        g_t, Σ X_st⟨g_s, g_t⟩ ≤ Σ |X_st| (the absolute-value bound of Choquette-Choo, Ganesh,
        McKenna, McMahan, Rush, Thakurta, Xu 2023, "(Amplified) banded matrix factorization",
        NeurIPS, Eq. (5)), with equality for equal g_t when X ≥ 0 (Choquette-Choo, McMahan,
        Rush, Thakurta 2023, "Multi-epoch matrix factorization mechanisms", ICML, Section 2);
        the relaxation bounds each row's contribution by its own maximum over patterns.
        Rounding: the computed Gram is within n·u·(|C|ᵀ|C|) of the exact one (Higham,
        "Accuracy and stability of numerical algorithms", Section 3.5), which is added before
        the maximisation, and the sums are rounded up.

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
    if _separated_columns_disjoint(c, b):
        norm2 = np.einsum("ij,ij->j", c, c)
        total, _ = _best_separated_sums(norm2[None, :], b, k)
        value = math.sqrt(_round_up(float(total[0]), c.shape[0] + k))
        return SensitivityBounds(math.sqrt(float(total[0])), value, True)
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
        candidates = _candidates(n, b, k, dp_pattern)
        lower2 = max(_quadratic(gram, p) for p in candidates)
        exact = lower2 >= upper2 * (1.0 - _EXACT_RTOL)
        if not exact:
            incumbent = max(candidates, key=lambda p: _quadratic(absolute, p))
            searched = _branch_and_bound(absolute, row_bound, b, k, incumbent)
            if searched is not None:
                upper2 = _quadratic(absolute, searched)
                lower2 = max(lower2, _quadratic(gram, searched))
                exact = nonnegative
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
        The value is ≥ the sensitivity (see :func:`sensitivity_bounds`: the absolute-value
        bound of Choquette-Choo et al. 2023, NeurIPS, Eq. (5), exact for a non-negative Gram by
        Choquette-Choo, McMahan, Rush, Thakurta 2023, ICML, Section 2), rounded up past float64
        error, so a Gaussian mechanism calibrated to it is at least as private as claimed.

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
